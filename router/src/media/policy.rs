//! What the operator allows for media inputs: how many, how large, and which hosts may be fetched.
//! Built once from the router's flags; `resolve` and the shard's decoder read it.

use std::net::IpAddr;
use std::time::Duration;

use crate::config::Config;
use crate::ir::Modality;

/// Every media limit and the fetch rules. The video and audio durations are not checked here (the
/// router reads no container headers); they travel to the shard's decoder, which checks them.
#[derive(Clone, Debug, PartialEq)]
pub struct MediaPolicy {
    /// Hosts `http(s)` URLs may be fetched from; empty: data URLs only.
    pub allow_hosts: AllowList,
    /// Whole fetch of one item (connect, redirects, body).
    pub fetch_timeout: Duration,
    /// Bytes of one item, decoded (data URLs) or downloaded.
    pub max_item_bytes: usize,
    /// Items of one request, all kinds together.
    pub max_items: usize,
    pub max_images: usize,
    pub max_audio: usize,
    pub max_videos: usize,
    /// Width × height of one image, read from its header.
    pub max_image_pixels: u64,
    pub max_video_seconds: f64,
    pub max_video_frames: u32,
    pub max_audio_seconds: f64,
}

impl Default for MediaPolicy {
    /// The flags' defaults (see `Config`): data URLs only, 8 items, 20 MiB, 16 Mpx.
    fn default() -> Self {
        MediaPolicy {
            allow_hosts: AllowList::default(),
            fetch_timeout: Duration::from_secs(10),
            max_item_bytes: 20 << 20,
            max_items: 8,
            max_images: 8,
            max_audio: 4,
            max_videos: 2,
            max_image_pixels: 4096 * 4096,
            max_video_seconds: 60.0,
            max_video_frames: 240,
            max_audio_seconds: 60.0,
        }
    }
}

/// Why the media flags do not make a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(
        "--media-allow-hosts: '{0}' is not a host name, an IP address, '*.domain' or '*' (no scheme, port or path)"
    )]
    NotAHost(String),
}

impl MediaPolicy {
    pub fn from_config(config: &Config) -> Result<Self, PolicyError> {
        Ok(MediaPolicy {
            allow_hosts: AllowList::parse(&config.flags.media_allow_hosts)?,
            fetch_timeout: Duration::from_secs(config.flags.media_fetch_timeout_secs),
            max_item_bytes: config.flags.max_media_bytes,
            max_items: config.flags.max_media_items,
            max_images: config.flags.max_image_items,
            max_audio: config.flags.max_audio_items,
            max_videos: config.flags.max_video_items,
            max_image_pixels: config.flags.max_image_pixels,
            max_video_seconds: config.flags.max_video_seconds,
            max_video_frames: config.flags.max_video_frames,
            max_audio_seconds: config.flags.max_audio_seconds,
        })
    }

    /// The per-kind count limit and its name in messages.
    pub fn max_of(&self, modality: Modality) -> (usize, &'static str) {
        match modality {
            Modality::Image => (self.max_images, "max_image_items"),
            Modality::Audio => (self.max_audio, "max_audio_items"),
            Modality::Video => (self.max_videos, "max_video_items"),
        }
    }
}

/// `--media-allow-hosts`: host names, IP literals, `*.domain` for its subdomains, and `*` for any
/// public host. Loopback, link-local and private addresses are reached only through an entry that
/// names them (a host or IP literal, or a `*.domain` pattern), never through `*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    any_public: bool,
    entries: Vec<HostEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostEntry {
    Name(String),
    Ip(IpAddr),
    /// `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`.
    Subdomains(String),
}

/// Whether a host may be fetched, and whether an entry names it (which lets it reach non-public
/// addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRule {
    Refused,
    /// Allowed by `*`: public addresses only.
    PublicOnly,
    /// Named by an entry: any address.
    Named,
}

impl AllowList {
    /// Any public host (`*`), and no host named: for tests and embedders.
    pub fn any_public() -> Self {
        AllowList {
            any_public: true,
            entries: Vec::new(),
        }
    }

    /// Entries as the flag gives them (a comma list, already split or not); blanks are skipped.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, PolicyError> {
        let mut list = AllowList::default();
        for raw in items.iter().flat_map(|s| s.as_ref().split(',')) {
            let entry = raw.trim();
            if entry.is_empty() {
                continue;
            }
            if entry == "*" {
                list.any_public = true;
                continue;
            }
            let unbracketed = entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .unwrap_or(entry);
            if let Ok(ip) = unbracketed.parse::<IpAddr>() {
                list.entries.push(HostEntry::Ip(canonical_ip(ip)));
                continue;
            }
            let (pattern, name) = match entry.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, entry),
            };
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            let valid = !name.is_empty()
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                });
            if !valid {
                return Err(PolicyError::NotAHost(entry.to_owned()));
            }
            list.entries.push(if pattern {
                HostEntry::Subdomains(name)
            } else {
                HostEntry::Name(name)
            });
        }
        Ok(list)
    }

    /// No entry at all: only data URLs are read.
    pub fn is_empty(&self) -> bool {
        !self.any_public && self.entries.is_empty()
    }

    /// The rule for a host as the URL parser normalised it (lowercase name, or an IP literal).
    pub fn rule_for_name(&self, host: &str) -> HostRule {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let named = self.entries.iter().any(|e| match e {
            HostEntry::Name(n) => *n == host,
            HostEntry::Subdomains(d) => host
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            HostEntry::Ip(_) => false,
        });
        self.rule(named)
    }

    pub fn rule_for_ip(&self, ip: IpAddr) -> HostRule {
        let ip = canonical_ip(ip);
        let named = self
            .entries
            .iter()
            .any(|e| matches!(e, HostEntry::Ip(listed) if *listed == ip));
        self.rule(named)
    }

    fn rule(&self, named: bool) -> HostRule {
        if named {
            HostRule::Named
        } else if self.any_public {
            HostRule::PublicOnly
        } else {
            HostRule::Refused
        }
    }
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn an_empty_list_refuses_every_host() {
        let list = AllowList::parse::<&str>(&[]).unwrap();
        assert!(list.is_empty());
        assert_eq!(list.rule_for_name("example.com"), HostRule::Refused);
        assert_eq!(
            list.rule_for_ip("127.0.0.1".parse().unwrap()),
            HostRule::Refused
        );
        assert!(AllowList::parse(&[" , ,"]).unwrap().is_empty());
    }

    #[test]
    fn star_allows_public_hosts_and_names_none() {
        let list = AllowList::parse(&["*"]).unwrap();
        assert_eq!(list.rule_for_name("example.com"), HostRule::PublicOnly);
        assert_eq!(list.rule_for_name("localhost"), HostRule::PublicOnly);
        assert_eq!(
            list.rule_for_ip("127.0.0.1".parse().unwrap()),
            HostRule::PublicOnly
        );
    }

    #[test]
    fn entries_name_hosts_ips_and_subdomains() {
        let list = AllowList::parse(&["Images.Example.com., 127.0.0.1,[::1]", "*.cdn.example.org"])
            .unwrap();
        assert_eq!(list.rule_for_name("images.example.com"), HostRule::Named);
        assert_eq!(list.rule_for_name("example.com"), HostRule::Refused);
        assert_eq!(list.rule_for_name("a.cdn.example.org"), HostRule::Named);
        assert_eq!(list.rule_for_name("a.b.cdn.example.org"), HostRule::Named);
        assert_eq!(list.rule_for_name("cdn.example.org"), HostRule::Refused);
        assert_eq!(list.rule_for_name("evilcdn.example.org"), HostRule::Refused);
        assert_eq!(
            list.rule_for_ip("127.0.0.1".parse().unwrap()),
            HostRule::Named
        );
        assert_eq!(
            list.rule_for_ip("::ffff:127.0.0.1".parse().unwrap()),
            HostRule::Named
        );
        assert_eq!(list.rule_for_ip("::1".parse().unwrap()), HostRule::Named);
        assert_eq!(
            list.rule_for_ip("127.0.0.2".parse().unwrap()),
            HostRule::Refused
        );
        // A name entry never matches an address and the other way round.
        assert_eq!(list.rule_for_name("127.0.0.1"), HostRule::Refused);
    }

    #[test]
    fn urls_and_ports_are_not_hosts() {
        for bad in [
            "http://example.com",
            "example.com:443",
            "example.com/x",
            "*",
        ] {
            let parsed = AllowList::parse(&[bad]);
            if bad == "*" {
                assert!(parsed.is_ok());
            } else {
                let e = parsed.unwrap_err();
                assert_eq!(e, PolicyError::NotAHost(bad.to_owned()));
                let text = e.to_string();
                assert!(
                    text.contains("--media-allow-hosts") && text.contains(bad),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn defaults_are_the_flags_defaults() {
        let config = Config::parse_from(["decision-router", "--model-dir", "/m"]);
        assert_eq!(
            MediaPolicy::from_config(&config).unwrap(),
            MediaPolicy::default()
        );
        let config = Config::parse_from([
            "decision-router",
            "--model-dir",
            "/m",
            "--media-allow-hosts",
            "a.example,*",
            "--media-fetch-timeout-secs",
            "3",
            "--max-media-items",
            "5",
            "--max-media-bytes",
            "1000",
            "--max-image-items",
            "4",
            "--max-audio-items",
            "3",
            "--max-video-items",
            "1",
            "--max-image-pixels",
            "100",
            "--max-video-seconds",
            "12.5",
            "--max-video-frames",
            "30",
            "--max-audio-seconds",
            "7.5",
        ]);
        let policy = MediaPolicy::from_config(&config).unwrap();
        assert_eq!(
            policy,
            MediaPolicy {
                allow_hosts: AllowList::parse(&["a.example", "*"]).unwrap(),
                fetch_timeout: Duration::from_secs(3),
                max_item_bytes: 1000,
                max_items: 5,
                max_images: 4,
                max_audio: 3,
                max_videos: 1,
                max_image_pixels: 100,
                max_video_seconds: 12.5,
                max_video_frames: 30,
                max_audio_seconds: 7.5,
            }
        );
    }
}
