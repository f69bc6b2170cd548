//! The calibration database: one SQLite file, `calibrations.sqlite3` under `--data-dir` (a volume in
//! the image), or an in-memory database without the flag (fits then last until the router stops).
//! A fit is stored as its JSON text: the document an export answers is the row.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

/// The file under `--data-dir`.
pub const FILE_NAME: &str = "calibrations.sqlite3";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("calibration database {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
}

pub struct Store {
    connection: Mutex<Connection>,
    path: Option<PathBuf>,
}

impl Store {
    /// Opens `data_dir/calibrations.sqlite3` (creating the folder and the table), or a database in
    /// memory when there is no data directory.
    pub fn open(data_dir: Option<&Path>) -> Result<Store, StoreError> {
        let path = match data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                    path: dir.to_owned(),
                    source,
                })?;
                Some(dir.join(FILE_NAME))
            }
            None => None,
        };
        let name = path
            .as_ref()
            .map_or(":memory:".to_owned(), |p| p.display().to_string());
        let wrap = |source| StoreError::Sqlite {
            path: name.clone(),
            source,
        };
        let connection = match &path {
            Some(p) => Connection::open(p),
            None => Connection::open_in_memory(),
        }
        .map_err(wrap)?;
        // Another router on the same volume waits for a write instead of failing at once.
        connection
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(wrap)?;
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS calibrations (
                     id TEXT PRIMARY KEY NOT NULL,
                     created INTEGER NOT NULL,
                     document TEXT NOT NULL
                 );",
            )
            .map_err(wrap)?;
        Ok(Store {
            connection: Mutex::new(connection),
            path,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn error(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self
                .path
                .as_ref()
                .map_or(":memory:".to_owned(), |p| p.display().to_string()),
            source,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let connection = match self.connection.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&connection).map_err(|e| self.error(e))
    }

    /// Every stored fit as (id, JSON text), oldest first.
    pub fn all(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.with(|c| {
            let mut statement =
                c.prepare("SELECT id, document FROM calibrations ORDER BY created, rowid")?;
            let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
            rows.collect()
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT document FROM calibrations WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )
            .optional()
        })
    }

    pub fn insert(&self, id: &str, created: u64, document: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO calibrations (id, created, document) VALUES (?1, ?2, ?3)",
                params![id, created as i64, document],
            )
            .map(|_| ())
        })
    }

    /// `false` when no row had the id.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute("DELETE FROM calibrations WHERE id = ?1", params![id])
                .map(|n| n > 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_survive_reopening_the_file() {
        let dir = std::env::temp_dir().join(format!("calib-store-{}", uuid::Uuid::new_v4()));
        {
            let store = Store::open(Some(&dir)).unwrap();
            store.insert("b", 2, "{\"x\": 2}").unwrap();
            store.insert("a", 1, "{\"x\": 1}").unwrap();
            assert!(store.insert("a", 3, "{}").is_err());
        }
        let store = Store::open(Some(&dir)).unwrap();
        assert_eq!(store.path(), Some(dir.join(FILE_NAME).as_path()));
        assert_eq!(
            store.all().unwrap(),
            vec![
                ("a".to_owned(), "{\"x\": 1}".to_owned()),
                ("b".to_owned(), "{\"x\": 2}".to_owned())
            ]
        );
        assert!(store.delete("a").unwrap());
        assert!(!store.delete("a").unwrap());
        assert_eq!(store.get("a").unwrap(), None);
        drop(store);
        assert_eq!(Store::open(Some(&dir)).unwrap().all().unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_data_dir_the_database_is_in_memory() {
        let store = Store::open(None).unwrap();
        assert_eq!(store.path(), None);
        store.insert("a", 1, "{}").unwrap();
        assert_eq!(store.all().unwrap().len(), 1);
        assert_eq!(Store::open(None).unwrap().all().unwrap().len(), 0);
    }
}
