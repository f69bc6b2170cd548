//! Which kernels Intel MKL runs in the shards. PyPI's torch links MKL for its float32 matrix
//! products and for those inside its CPU attention kernel, and MKL takes a generic path on any CPU
//! not made by Intel, whatever instruction sets it has. On an AMD EPYC with AVX-512 (Zen 5, 2 cores)
//! preloading `libdecision_mkl_dispatch.so` (the `mkl-dispatch` crate), which tells MKL to choose by
//! instruction sets, made float32 GEMMs 2.1x faster and attention over 860 tokens 3.5x faster in
//! bfloat16 and 2.0x in float32; a bfloat16 read of 8 questions over 540 tokens took 1.19 s instead of
//! 1.73 s (bench/results/2026-12-04-zen5/).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

use crate::allocator::prepend;

/// The library the launcher preloads, looked for next to the launcher's own executable.
pub const LIBRARY: &str = "libdecision_mkl_dispatch.so";
/// Where the CPU's vendor and instruction sets are read.
pub const CPUINFO: &str = "/proc/cpuinfo";

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum MklDispatch {
    /// `features` on AMD CPUs with AVX-512, where it was measured; MKL's own choice elsewhere.
    Auto,
    /// MKL chooses its kernels by the CPU's instruction sets on every vendor (startup fails when
    /// the library is missing).
    Features,
    /// MKL's own choice: its generic kernels on CPUs not made by Intel.
    Vendor,
}

/// The CPU as /proc/cpuinfo describes its first processor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cpu {
    pub vendor: String,
    pub flags: HashSet<String>,
}

impl Cpu {
    pub fn parse(cpuinfo: &str) -> Cpu {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_owned())
            })
        };
        Cpu {
            vendor: field("vendor_id").unwrap_or_default(),
            flags: field("flags")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        }
    }

    pub fn read() -> Cpu {
        Cpu::parse(&std::fs::read_to_string(CPUINFO).unwrap_or_default())
    }

    fn is_amd_with_avx512(&self) -> bool {
        self.vendor == "AuthenticAMD" && self.flags.contains("avx512f")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--mkl-dispatch features: no {LIBRARY} in {dir}; `make install` builds it next to the launcher"
)]
pub struct LibraryMissing {
    pub dir: String,
}

/// What the shards get: a library to preload (or none) and a line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub preload: Option<PathBuf>,
    pub description: String,
}

impl Resolved {
    /// Puts the library first in the shard's `LD_PRELOAD`: into the value `env` already sets (the
    /// allocator's), else ahead of what the launcher inherited.
    pub fn apply(&self, env: &mut Vec<(String, String)>, inherited: Option<String>) {
        let Some(library) = &self.preload else {
            return;
        };
        let library = library.to_string_lossy();
        match env.iter_mut().find(|(name, _)| name == "LD_PRELOAD") {
            Some((_, value)) => *value = prepend(&library, Some(std::mem::take(value))),
            None => env.push(("LD_PRELOAD".into(), prepend(&library, inherited))),
        }
    }
}

/// Resolves `choice` for `cpu`, with the library at `dir/LIBRARY` if it is there.
pub fn resolve(choice: MklDispatch, cpu: &Cpu, dir: &Path) -> Result<Resolved, LibraryMissing> {
    let path = dir.join(LIBRARY);
    let found = path.is_file().then_some(path);
    let vendor = |why: &str| Resolved {
        preload: None,
        description: format!("MKL's own kernel choice ({why})"),
    };
    match choice {
        MklDispatch::Vendor => Ok(vendor("--mkl-dispatch vendor")),
        MklDispatch::Auto if !cpu.is_amd_with_avx512() => Ok(vendor("not an AMD CPU with AVX-512")),
        MklDispatch::Auto if found.is_none() => {
            Ok(vendor(&format!("no {LIBRARY} in {}", dir.display())))
        }
        MklDispatch::Features | MklDispatch::Auto => match found {
            Some(library) => Ok(Resolved {
                description: format!(
                    "MKL kernels chosen by instruction sets ({})",
                    library.display()
                ),
                preload: Some(library),
            }),
            None => Err(LibraryMissing {
                dir: dir.display().to_string(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZEN5: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\n";
    const ZEN3: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n";
    const XEON: &str =
        "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f amx_bf16\n";

    fn dir_with_library() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LIBRARY), b"").unwrap();
        dir
    }

    #[test]
    fn parses_vendor_and_flags_of_the_first_processor() {
        let cpu = Cpu::parse(ZEN5);
        assert_eq!(cpu.vendor, "AuthenticAMD");
        assert!(cpu.flags.contains("avx512f") && cpu.flags.contains("avx512_bf16"));
        assert_eq!(Cpu::parse(""), Cpu::default());
    }

    #[test]
    fn auto_preloads_only_on_amd_with_avx512() {
        let dir = dir_with_library();
        let zen5 = resolve(MklDispatch::Auto, &Cpu::parse(ZEN5), dir.path()).unwrap();
        assert_eq!(zen5.preload, Some(dir.path().join(LIBRARY)));
        for other in [ZEN3, XEON] {
            let resolved = resolve(MklDispatch::Auto, &Cpu::parse(other), dir.path()).unwrap();
            assert_eq!(resolved.preload, None, "{other}");
            assert!(resolved.description.contains("not an AMD CPU with AVX-512"));
        }
    }

    #[test]
    fn auto_without_the_library_keeps_mkls_choice_and_features_refuses() {
        let empty = tempfile::tempdir().unwrap();
        let auto = resolve(MklDispatch::Auto, &Cpu::parse(ZEN5), empty.path()).unwrap();
        assert_eq!(auto.preload, None);
        assert!(auto.description.contains(LIBRARY));
        let refused = resolve(MklDispatch::Features, &Cpu::parse(XEON), empty.path()).unwrap_err();
        assert!(refused.to_string().contains("make install"), "{refused}");
    }

    #[test]
    fn features_preloads_on_any_cpu_and_vendor_never() {
        let dir = dir_with_library();
        let xeon = resolve(MklDispatch::Features, &Cpu::parse(XEON), dir.path()).unwrap();
        assert_eq!(xeon.preload, Some(dir.path().join(LIBRARY)));
        let vendor = resolve(MklDispatch::Vendor, &Cpu::parse(ZEN5), dir.path()).unwrap();
        assert_eq!(vendor.preload, None);
    }

    #[test]
    fn the_library_goes_first_in_the_allocators_preload_or_the_inherited_one() {
        let resolved = Resolved {
            preload: Some(PathBuf::from("/opt/libdecision_mkl_dispatch.so")),
            description: String::new(),
        };
        let mut with_tcmalloc = vec![(
            "LD_PRELOAD".to_owned(),
            "/usr/lib/libtcmalloc.so.4:/opt/mine.so".to_owned(),
        )];
        resolved.apply(&mut with_tcmalloc, Some("/ignored.so".into()));
        assert_eq!(
            with_tcmalloc,
            [(
                "LD_PRELOAD".to_owned(),
                "/opt/libdecision_mkl_dispatch.so:/usr/lib/libtcmalloc.so.4:/opt/mine.so"
                    .to_owned()
            )]
        );
        let mut glibc = vec![("GLIBC_TUNABLES".to_owned(), "x".to_owned())];
        resolved.apply(&mut glibc, Some("/opt/mine.so".into()));
        assert_eq!(
            glibc[1],
            (
                "LD_PRELOAD".to_owned(),
                "/opt/libdecision_mkl_dispatch.so:/opt/mine.so".to_owned()
            )
        );
        let mut untouched = vec![];
        Resolved {
            preload: None,
            description: String::new(),
        }
        .apply(&mut untouched, Some("/opt/mine.so".into()));
        assert!(untouched.is_empty());
    }
}
