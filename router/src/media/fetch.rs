//! Fetching `http(s)` media URLs under the operator's rules: listed hosts only, public addresses
//! unless an entry names the host, every redirect hop checked again, a byte cap while streaming and
//! one deadline for the whole fetch.
//!
//! Addresses are checked where they are resolved: the client's DNS resolver drops the ones a host may
//! not reach and the connection goes to what it kept, so a name cannot resolve to a public address for
//! the check and to a private one for the connection. IP literals never reach the resolver and are
//! checked before the request.

use std::error::Error as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::Url;
use url::Host;

use super::policy::{canonical_ip, AllowList, HostRule, MediaPolicy};

/// Redirects followed per item; each hop is checked like the first URL.
pub const MAX_REDIRECTS: usize = 3;

/// The HTTP client media URLs are fetched with, and the rules it fetches under. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Fetcher {
    client: reqwest::Client,
    allow: Arc<AllowList>,
    timeout: Duration,
}

/// A fetched body and the type the server declared for it.
#[derive(Debug)]
pub struct Fetched {
    pub bytes: Bytes,
    pub content_type: Option<String>,
}

/// Why a URL gave no bytes. Each names the host it concerns, never the full URL (whose path and
/// query may hold credentials that do not belong in logs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("this server fetches no media URLs (media_allow_hosts is empty); send the bytes in a data: URL")]
    Disabled,
    #[error("{scheme}: URLs are not fetched (only http and https)")]
    Scheme { scheme: String },
    #[error("host {host} is not in media_allow_hosts")]
    HostNotAllowed { host: String },
    #[error("{}; only hosts that media_allow_hosts names (not '*') reach those", address_words(.host, .addr, .kind))]
    AddressNotAllowed {
        host: String,
        addr: IpAddr,
        kind: &'static str,
    },
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("{host} answered a redirect without a valid Location")]
    BadRedirect { host: String },
    #[error("after a redirect from {from}: {cause}")]
    Redirected {
        from: String,
        cause: Box<FetchError>,
    },
    #[error("{host} answered {status}")]
    Status { host: String, status: String },
    #[error("fetching from {host} took longer than {} s (media_fetch_timeout_secs)", .after.as_secs_f64())]
    Timeout { host: String, after: Duration },
    #[error("cannot fetch from {host}: {detail}")]
    Connect { host: String, detail: String },
    #[error("reading the body from {host} failed: {detail}")]
    Body { host: String, detail: String },
    /// `len` is the Content-Length the server announced, when that alone was over the limit.
    #[error("the body is larger than the limit of {limit} bytes (max_media_bytes)")]
    TooLarge { len: Option<u64>, limit: usize },
}

/// "10.0.0.1 is a private address", "host db.internal resolves to 10.0.0.1, a private address".
fn address_words(host: &str, addr: &IpAddr, kind: &str) -> String {
    let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if literal.parse::<IpAddr>().is_ok() {
        format!("{addr} is {article} {kind} address")
    } else {
        format!("host {host} resolves to {addr}, {article} {kind} address")
    }
}

impl FetchError {
    /// The `reason` label of `decision_media_fetch_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::Disabled => "disabled",
            FetchError::Scheme { .. } => "scheme",
            FetchError::HostNotAllowed { .. } => "host_not_allowed",
            FetchError::AddressNotAllowed { .. } => "address_not_allowed",
            FetchError::TooManyRedirects | FetchError::BadRedirect { .. } => "redirect",
            FetchError::Redirected { cause, .. } => cause.reason(),
            FetchError::Status { .. } => "status",
            FetchError::Timeout { .. } => "timeout",
            FetchError::Connect { .. } => "connect",
            FetchError::Body { .. } => "body",
            FetchError::TooLarge { .. } => "too_large",
        }
    }

    /// The error behind any redirects.
    pub fn innermost(&self) -> &FetchError {
        match self {
            FetchError::Redirected { cause, .. } => cause.innermost(),
            other => other,
        }
    }
}

impl Fetcher {
    /// A client under the policy's host rules and timeout: no proxy (an environment's `HTTP_PROXY`
    /// would bypass the address rules), no automatic redirects, no decompression.
    pub fn new(policy: &MediaPolicy) -> Result<Self, reqwest::Error> {
        let allow = Arc::new(policy.allow_hosts.clone());
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver {
                allow: allow.clone(),
            }))
            .connect_timeout(policy.fetch_timeout)
            .timeout(policy.fetch_timeout)
            .user_agent(concat!("decision-inference/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Fetcher {
            client,
            allow,
            timeout: policy.fetch_timeout,
        })
    }

    /// Whether the URL may be fetched at all, without any network: fetching on, scheme, host, and
    /// the address of an IP literal.
    pub fn check(&self, url: &Url) -> Result<(), FetchError> {
        if self.allow.is_empty() {
            return Err(FetchError::Disabled);
        }
        self.check_hop(url).map(|_| ())
    }

    /// The URL's body, at most `max_bytes` of it, within the timeout.
    pub async fn fetch(&self, url: Url, max_bytes: usize) -> Result<Fetched, FetchError> {
        self.check(&url)?;
        let host = host_of(&url);
        match tokio::time::timeout(self.timeout, self.follow(url, max_bytes)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout {
                host,
                after: self.timeout,
            }),
        }
    }

    async fn follow(&self, mut url: Url, max_bytes: usize) -> Result<Fetched, FetchError> {
        let mut from: Option<String> = None;
        let redirected = |from: &Option<String>, e: FetchError| match from {
            Some(from) => FetchError::Redirected {
                from: from.clone(),
                cause: Box::new(e),
            },
            None => e,
        };
        for hop in 0..=MAX_REDIRECTS {
            let host = self.check_hop(&url).map_err(|e| redirected(&from, e))?;
            let response = self
                .client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| redirected(&from, send_error(&host, &e, self.timeout)))?;
            let status = response.status();
            if status.is_redirection() {
                if hop == MAX_REDIRECTS {
                    return Err(FetchError::TooManyRedirects);
                }
                let next = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|location| url.join(location).ok())
                    .ok_or_else(|| FetchError::BadRedirect { host: host.clone() })
                    .map_err(|e| redirected(&from, e))?;
                from = Some(host);
                url = next;
                continue;
            }
            if !status.is_success() {
                return Err(redirected(
                    &from,
                    FetchError::Status {
                        host,
                        status: status.to_string(),
                    },
                ));
            }
            return read_body(response, &host, max_bytes, self.timeout)
                .await
                .map_err(|e| redirected(&from, e));
        }
        Err(FetchError::TooManyRedirects)
    }

    /// Scheme and host of one hop; an IP literal's address too (names are checked as they resolve).
    fn check_hop(&self, url: &Url) -> Result<String, FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Scheme {
                scheme: url.scheme().to_owned(),
            });
        }
        let host = host_of(url);
        let (rule, ip) = match url.host() {
            Some(Host::Domain(name)) => (self.allow.rule_for_name(name), None),
            Some(Host::Ipv4(ip)) => (self.allow.rule_for_ip(IpAddr::V4(ip)), Some(IpAddr::V4(ip))),
            Some(Host::Ipv6(ip)) => (self.allow.rule_for_ip(IpAddr::V6(ip)), Some(IpAddr::V6(ip))),
            None => return Err(FetchError::HostNotAllowed { host }),
        };
        match (
            rule,
            ip.and_then(|ip| non_public(ip).map(|kind| (ip, kind))),
        ) {
            (HostRule::Refused, _) => Err(FetchError::HostNotAllowed { host }),
            (HostRule::PublicOnly, Some((addr, kind))) => {
                Err(FetchError::AddressNotAllowed { host, addr, kind })
            }
            _ => Ok(host),
        }
    }
}

fn host_of(url: &Url) -> String {
    url.host_str().unwrap_or_default().to_owned()
}

/// The body, refused as soon as it passes `max_bytes` (a Content-Length over it refuses it at once,
/// but one under it is not trusted: the count is of bytes received).
async fn read_body(
    mut response: reqwest::Response,
    host: &str,
    max_bytes: usize,
    timeout: Duration,
) -> Result<Fetched, FetchError> {
    let announced = response.content_length();
    if let Some(len) = announced.filter(|len| *len > max_bytes as u64) {
        return Err(FetchError::TooLarge {
            len: Some(len),
            limit: max_bytes,
        });
    }
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = BytesMut::with_capacity(announced.unwrap_or(0).min(1 << 20) as usize);
    loop {
        let chunk = response.chunk().await.map_err(|e| {
            if e.is_timeout() {
                FetchError::Timeout {
                    host: host.to_owned(),
                    after: timeout,
                }
            } else {
                FetchError::Body {
                    host: host.to_owned(),
                    detail: root_cause(&e),
                }
            }
        })?;
        let Some(chunk) = chunk else { break };
        if body.len() + chunk.len() > max_bytes {
            return Err(FetchError::TooLarge {
                len: None,
                limit: max_bytes,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Fetched {
        bytes: body.freeze(),
        content_type,
    })
}

/// A refusal from the resolver comes back as itself; anything else is a timeout or a connect error.
fn send_error(host: &str, error: &reqwest::Error, timeout: Duration) -> FetchError {
    let mut source = error.source();
    while let Some(e) = source {
        if let Some(Refusal(refused)) = e.downcast_ref::<Refusal>() {
            return refused.clone();
        }
        source = e.source();
    }
    if error.is_timeout() {
        FetchError::Timeout {
            host: host.to_owned(),
            after: timeout,
        }
    } else {
        FetchError::Connect {
            host: host.to_owned(),
            detail: root_cause(error),
        }
    }
}

/// The innermost error's text ("Connection refused (os error 111)"): reqwest's own names the URL.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = error;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refusal(FetchError);

/// Resolves names and keeps only the addresses the host may reach.
struct CheckedResolver {
    allow: Arc<AllowList>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let rule = allow.rule_for_name(&host);
            if rule == HostRule::Refused {
                return Err(Box::new(Refusal(FetchError::HostNotAllowed { host })) as _);
            }
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let kept: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|addr| match (rule, non_public(addr.ip())) {
                    (HostRule::PublicOnly, Some(kind)) => {
                        refused.get_or_insert((addr.ip(), kind));
                        false
                    }
                    _ => true,
                })
                .collect();
            match (kept.is_empty(), refused) {
                (true, Some((addr, kind))) => {
                    Err(Box::new(Refusal(FetchError::AddressNotAllowed { host, addr, kind })) as _)
                }
                _ => Ok(Box::new(kept.into_iter()) as Addrs),
            }
        })
    }
}

/// What kind of non-public address this is, or `None` for a public one. IPv4 addresses embedded in
/// IPv6 ones (mapped, compatible, NAT64, 6to4) are judged as the IPv4 address.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    match (a, b) {
        (0, _) => Some("unspecified"),
        (127, _) => Some("loopback"),
        (10, _) | (192, 168) => Some("private"),
        (172, 16..=31) => Some("private"),
        (169, 254) => Some("link-local"),
        (100, 64..=127) => Some("shared (CGNAT)"),
        (224..=239, _) => Some("multicast"),
        (240..=255, _) => Some("reserved"),
        _ => None,
    }
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| {
        non_public_v4(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        ))
    };
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if s[..6] == [0; 6] {
        // IPv4-compatible (deprecated).
        embedded(s[6], s[7])
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64.
        embedded(s[6], s[7])
    } else if s[0] == 0x2002 {
        // 6to4.
        embedded(s[1], s[2])
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
        Some("private")
    } else if s[0] & 0xff00 == 0xff00 {
        Some("multicast")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_public_addresses_by_kind() {
        let kind = |s: &str| non_public(s.parse().unwrap());
        for (addr, expected) in [
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("192.168.1.1", Some("private")),
            ("fc00::1", Some("private")),
            ("fd12:3456::1", Some("private")),
            ("::ffff:10.0.0.1", Some("private")),
            ("64:ff9b::a00:1", Some("private")),
            ("2002:c0a8:101::1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("0.0.0.0", Some("unspecified")),
            ("::", Some("unspecified")),
            ("100.64.0.1", Some("shared (CGNAT)")),
            ("100.127.255.255", Some("shared (CGNAT)")),
            ("224.0.0.1", Some("multicast")),
            ("ff02::1", Some("multicast")),
            ("255.255.255.255", Some("reserved")),
            ("8.8.8.8", None),
            ("172.32.0.1", None),
            ("100.128.0.1", None),
            ("192.169.0.1", None),
            ("2606:4700::1111", None),
            ("::ffff:8.8.8.8", None),
        ] {
            assert_eq!(kind(addr), expected, "{addr}");
        }
    }

    #[test]
    fn every_failure_has_a_reason_label() {
        let host = || "h".to_owned();
        let redirected = FetchError::Redirected {
            from: host(),
            cause: Box::new(FetchError::HostNotAllowed { host: host() }),
        };
        assert_eq!(redirected.reason(), "host_not_allowed");
        assert_eq!(
            redirected.innermost(),
            &FetchError::HostNotAllowed { host: host() }
        );
        let refused = |host: &str, addr: &str, kind| FetchError::AddressNotAllowed {
            host: host.into(),
            addr: addr.parse().unwrap(),
            kind,
        };
        assert!(refused("[::ffff:7f00:1]", "127.0.0.1", "loopback")
            .to_string()
            .starts_with("127.0.0.1 is a loopback address; "));
        assert!(refused("db.internal", "10.0.0.1", "private")
            .to_string()
            .starts_with("host db.internal resolves to 10.0.0.1, a private address; "));
        assert!(refused("0.0.0.0", "0.0.0.0", "unspecified")
            .to_string()
            .starts_with("0.0.0.0 is an unspecified address"));
        assert_eq!(
            FetchError::Timeout {
                host: host(),
                after: Duration::from_millis(300)
            }
            .to_string(),
            "fetching from h took longer than 0.3 s (media_fetch_timeout_secs)"
        );
    }
}
