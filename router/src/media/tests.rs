//! `resolve` end to end: data URLs, every limit, and fetches from a local HTTP server each test
//! starts on 127.0.0.1 (no other network).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::image::samples::{gif, jpeg, png};
use super::*;
use crate::api::{openai, sglang};
use crate::profile::{Compat, Shape};

// ---- a local HTTP server --------------------------------------------------------------------

enum Reply {
    /// Sent as is (status line, headers, body), then the connection closes.
    Raw(Vec<u8>),
    /// The same, after a pause.
    Delayed(Duration, Vec<u8>),
    /// A head, then `count` copies of `chunk` with a pause before each.
    Trickle {
        head: Vec<u8>,
        chunk: Vec<u8>,
        count: usize,
        pause: Duration,
    },
}

struct Server {
    addr: SocketAddr,
    /// Connections accepted.
    hits: Arc<AtomicUsize>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Answers each request by its path, one connection per request.
async fn serve(reply: impl Fn(&str, SocketAddr) -> Reply + Send + Sync + 'static) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let reply = Arc::new(reply);
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let _ = match reply(&path, addr) {
                    Reply::Raw(bytes) => stream.write_all(&bytes).await,
                    Reply::Delayed(pause, bytes) => {
                        tokio::time::sleep(pause).await;
                        stream.write_all(&bytes).await
                    }
                    Reply::Trickle {
                        head,
                        chunk,
                        count,
                        pause,
                    } => {
                        let mut written = stream.write_all(&head).await;
                        for _ in 0..count {
                            if written.is_err() {
                                break;
                            }
                            tokio::time::sleep(pause).await;
                            written = stream.write_all(&chunk).await;
                        }
                        written
                    }
                };
                let _ = stream.shutdown().await;
            });
        }
    });
    Server { addr, hits }
}

fn ok(content_type: &str, body: &[u8]) -> Reply {
    let mut bytes = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    Reply::Raw(bytes)
}

fn redirect(location: &str) -> Reply {
    Reply::Raw(
        format!(
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .into_bytes(),
    )
}

fn status(line: &str) -> Reply {
    Reply::Raw(
        format!("HTTP/1.1 {line}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").into_bytes(),
    )
}

// ---- helpers ---------------------------------------------------------------------------------

fn data(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn images(urls: &[String]) -> Media {
    Media {
        images: urls.to_vec(),
        ..Media::default()
    }
}

fn allowing(hosts: &[&str]) -> MediaPolicy {
    MediaPolicy {
        allow_hosts: AllowList::parse(hosts).unwrap(),
        fetch_timeout: Duration::from_secs(5),
        ..MediaPolicy::default()
    }
}

async fn run(media: &Media, policy: &MediaPolicy) -> Result<Vec<MediaBlob>, DecisionError> {
    resolve(media, policy, &Fetcher::new(policy).unwrap()).await
}

/// Status under the default profile, the parameter it names, and its message.
#[track_caller]
fn refused(result: Result<Vec<MediaBlob>, DecisionError>) -> (u16, String, String) {
    let error = match result {
        Ok(blobs) => panic!("expected an error, got {} blobs", blobs.len()),
        Err(e) => e,
    };
    let status = Compat::Typesafe.status(&error, Shape::SystemOne).as_u16();
    let param = match &error {
        DecisionError::BadRequest { param, .. } => param.clone().unwrap_or_default(),
        DecisionError::MediaTooLarge { param, .. } => param.clone(),
        DecisionError::Invalid(fields) => fields[0].param(),
        other => panic!("unexpected error {other:?}"),
    };
    (status, param, error.to_string())
}

#[track_caller]
fn assert_refused(
    result: Result<Vec<MediaBlob>, DecisionError>,
    expected_status: u16,
    expected_param: &str,
    words: &[&str],
) {
    let (status, param, message) = refused(result);
    assert_eq!(
        (status, param.as_str()),
        (expected_status, expected_param),
        "{message}"
    );
    for word in words {
        assert!(message.contains(word), "'{word}' not in: {message}");
    }
}

// ---- data URLs -------------------------------------------------------------------------------

#[tokio::test]
async fn data_urls_come_back_in_field_order_with_their_hashes() {
    let media = Media {
        images: vec![
            data("image/png", &png(4, 3)),
            data("image/jpeg", &jpeg(8, 8)),
        ],
        audio: vec![data("audio/wav", b"RIFF....WAVE")],
        videos: vec![data("video/mp4", b"....ftypisom")],
        ..Media::default()
    };
    let blobs = run(&media, &MediaPolicy::default()).await.unwrap();
    let got: Vec<_> = blobs
        .iter()
        .map(|b| (b.modality, b.index, b.mime.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (Modality::Image, 0, Some("image/png")),
            (Modality::Image, 1, Some("image/jpeg")),
            (Modality::Audio, 0, Some("audio/wav")),
            (Modality::Video, 0, Some("video/mp4")),
        ]
    );
    assert_eq!(blobs[0].bytes, png(4, 3));
    assert_eq!(blobs[0].sha256, <[u8; 32]>::from(Sha256::digest(png(4, 3))));
    assert_eq!(&blobs[2].bytes[..], b"RIFF....WAVE");
}

#[tokio::test]
async fn a_large_item_is_hashed_off_the_async_workers_all_the_same() {
    let clip: Vec<u8> = (0..(HASH_INLINE_BYTES + 1)).map(|i| i as u8).collect();
    let media = Media {
        audio: vec![data("audio/wav", &clip)],
        ..Media::default()
    };
    let blobs = run(&media, &MediaPolicy::default()).await.unwrap();
    assert_eq!(blobs[0].sha256, <[u8; 32]>::from(Sha256::digest(&clip)));
}

#[tokio::test]
async fn an_untyped_or_octet_stream_data_url_is_read_by_its_bytes() {
    let media = Media {
        images: vec![data("", &gif(2, 2))],
        audio: vec![data("application/octet-stream", b"ID3...")],
        ..Media::default()
    };
    let blobs = run(&media, &MediaPolicy::default()).await.unwrap();
    assert_eq!(blobs[0].mime.as_deref(), Some("image/gif"));
    assert_eq!(blobs[1].mime, None);
}

#[tokio::test]
async fn base64_that_does_not_decode_is_a_400_naming_its_position() {
    let media = images(&[
        data("image/png", &png(1, 1)),
        "data:image/png;base64,not*base64!".into(),
    ]);
    assert_refused(
        run(&media, &MediaPolicy::default()).await,
        400,
        "images.1",
        &["images.1", "base64"],
    );
}

#[tokio::test]
async fn a_declared_type_of_another_kind_is_a_400() {
    assert_refused(
        run(
            &images(&[data("text/plain", b"hi")]),
            &MediaPolicy::default(),
        )
        .await,
        400,
        "images.0",
        &["text/plain", "not an image type"],
    );
    let audio = Media {
        audio: vec![data("image/png", &png(1, 1))],
        ..Media::default()
    };
    assert_refused(
        run(&audio, &MediaPolicy::default()).await,
        400,
        "audio.0",
        &["image/png", "not an audio type"],
    );
}

#[tokio::test]
async fn bytes_that_are_no_image_are_a_400() {
    let media = images(&[
        data("image/png", &png(1, 1)),
        data("image/png", &png(1, 1)),
        data("image/png", b"<html>not an image</html>"),
    ]);
    assert_refused(
        run(&media, &MediaPolicy::default()).await,
        400,
        "images.2",
        &["not a PNG, JPEG, WebP, GIF or BMP image"],
    );
}

#[tokio::test]
async fn a_truncated_png_header_is_a_400() {
    let media = images(&[data("image/png", &png(10, 10)[..18])]);
    assert_refused(
        run(&media, &MediaPolicy::default()).await,
        400,
        "images.0",
        &["PNG header is truncated or corrupt"],
    );
}

#[tokio::test]
async fn other_schemes_and_non_urls_are_a_400() {
    for url in [
        "file:///etc/passwd",
        "ftp://example.com/a.png",
        "gopher://example.com/",
        "javascript:alert(1)",
        "/relative/a.png",
        "a.png",
        "",
    ] {
        let media = images(&[data("image/png", &png(1, 1)), url.into()]);
        // Refused whatever the fetch rules: `*` does not open other schemes.
        let policy = allowing(&["*"]);
        assert_refused(run(&media, &policy).await, 400, "images.1", &["images.1"]);
    }
}

// ---- limits ----------------------------------------------------------------------------------

#[tokio::test]
async fn images_over_their_count_are_refused_naming_the_field_and_limit() {
    let policy = MediaPolicy {
        max_images: 2,
        ..MediaPolicy::default()
    };
    let one = data("image/png", &png(1, 1));
    assert_refused(
        run(&images(&[one.clone(), one.clone(), one]), &policy).await,
        422,
        "images",
        &["at most 2 images per request (max_image_items), got 3"],
    );
}

#[tokio::test]
async fn audio_over_its_count_is_refused() {
    let policy = MediaPolicy {
        max_audio: 1,
        ..MediaPolicy::default()
    };
    let media = Media {
        audio: vec![data("audio/wav", b"a"), data("audio/wav", b"b")],
        ..Media::default()
    };
    assert_refused(
        run(&media, &policy).await,
        422,
        "audio",
        &["at most 1 audio clips per request (max_audio_items), got 2"],
    );
}

#[tokio::test]
async fn videos_over_their_count_are_refused() {
    let policy = MediaPolicy {
        max_videos: 0,
        ..MediaPolicy::default()
    };
    let media = Media {
        videos: vec![data("video/mp4", b"v")],
        ..Media::default()
    };
    assert_refused(
        run(&media, &policy).await,
        422,
        "videos",
        &["(max_video_items), got 1"],
    );
}

#[tokio::test]
async fn items_over_the_total_are_refused_at_the_field_that_passes_it() {
    let policy = MediaPolicy {
        max_items: 3,
        ..MediaPolicy::default()
    };
    let one = data("image/png", &png(1, 1));
    let media = Media {
        images: vec![one.clone(), one],
        audio: vec![data("audio/wav", b"a"), data("audio/wav", b"b")],
        ..Media::default()
    };
    assert_refused(
        run(&media, &policy).await,
        422,
        "audio",
        &["at most 3 media items per request (max_media_items), got 4"],
    );
    // Other profiles and shapes give validation errors 400, as for max_questions.
    let error = run(&media, &policy).await.unwrap_err();
    assert_eq!(Compat::Vllm.status(&error, Shape::SystemOne).as_u16(), 400);
}

#[tokio::test]
async fn a_data_url_over_the_byte_cap_is_a_413() {
    let policy = MediaPolicy {
        max_item_bytes: 100,
        ..MediaPolicy::default()
    };
    let media = Media {
        images: vec![data("image/png", &png(1, 1))],
        audio: vec![data("audio/wav", &[0; 101])],
        ..Media::default()
    };
    assert_refused(
        run(&media, &policy).await,
        413,
        "audio.0",
        &["101 bytes, over the limit of 100 bytes (max_media_bytes)"],
    );
}

#[tokio::test]
async fn an_image_over_the_pixel_limit_is_a_413() {
    let policy = MediaPolicy {
        max_image_pixels: 1000 * 1000,
        ..MediaPolicy::default()
    };
    let media = images(&[
        data("image/png", &png(1000, 1000)),
        data("image/jpeg", &jpeg(1000, 1001)),
    ]);
    let (status, param, message) = refused(run(&media, &policy).await);
    assert_eq!((status, param.as_str()), (413, "images.1"));
    assert!(
        message.contains(
            "1000x1001 image is 1001000 pixels, over the limit of 1000000 (max_image_pixels)"
        ),
        "{message}"
    );
    // A 70000 x 70000 PNG is 33 bytes of header: refused without decoding anything.
    let bomb = images(&[data("image/png", &png(70_000, 70_000))]);
    assert_refused(
        run(&bomb, &MediaPolicy::default()).await,
        413,
        "images.0",
        &["max_image_pixels"],
    );
}

#[tokio::test]
async fn size_errors_name_the_item_in_every_wire_shape() {
    let policy = MediaPolicy {
        max_item_bytes: 10,
        ..MediaPolicy::default()
    };
    let error = run(&images(&[data("image/png", &png(1, 1))]), &policy)
        .await
        .unwrap_err();
    assert_eq!(
        openai::error_body(&error)["error"]["param"],
        serde_json::json!("images.0")
    );
    assert_eq!(
        sglang::error_body(&error, 413)["param"],
        serde_json::json!("images.0")
    );
    assert_eq!(error.error_type(), "request_too_large");
}

// ---- fetching --------------------------------------------------------------------------------

#[tokio::test]
async fn fetching_is_off_by_default() {
    let server = serve(|_, _| ok("image/png", &png(1, 1))).await;
    let media = images(&[data("image/png", &png(1, 1)), server.url("/a.png")]);
    assert_refused(
        run(&media, &MediaPolicy::default()).await,
        400,
        "images.1",
        &["media_allow_hosts is empty", "data: URL"],
    );
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_listed_host_is_fetched() {
    let server = serve(|path, _| match path {
        "/a.png" => ok("image/png", &png(30, 20)),
        _ => ok("audio/mpeg; charset=binary", b"ID3 audio"),
    })
    .await;
    let media = Media {
        images: vec![server.url("/a.png")],
        audio: vec![server.url("/a.mp3")],
        ..Media::default()
    };
    let blobs = run(&media, &allowing(&["127.0.0.1"])).await.unwrap();
    assert_eq!(blobs[0].bytes, png(30, 20));
    assert_eq!(blobs[0].mime.as_deref(), Some("image/png"));
    assert_eq!(&blobs[1].bytes[..], b"ID3 audio");
    assert_eq!(blobs[1].mime.as_deref(), Some("audio/mpeg"));
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn a_listed_name_reaches_loopback_through_the_resolver() {
    let server = serve(|_, _| ok("image/gif", &gif(3, 3))).await;
    let url = format!("http://localhost:{}/a.gif", server.addr.port());
    let blobs = run(&images(&[url]), &allowing(&["localhost"]))
        .await
        .unwrap();
    assert_eq!(blobs[0].bytes, gif(3, 3));
}

#[tokio::test]
async fn star_alone_never_reaches_loopback_or_private_addresses() {
    let server = serve(|_, _| ok("image/png", &png(1, 1))).await;
    let port = server.addr.port();
    let star = allowing(&["*"]);
    for (url, kind) in [
        (server.url("/a.png"), "loopback"),
        (format!("http://localhost:{port}/a.png"), "loopback"),
        (format!("http://[::1]:{port}/a.png"), "loopback"),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/a.png"),
            "loopback",
        ),
        // The URL parser reads these forms as 127.0.0.1.
        (format!("http://2130706433:{port}/a.png"), "loopback"),
        (format!("http://0x7f.1:{port}/a.png"), "loopback"),
        // Refused before any connection is tried: no packet leaves for these.
        ("http://10.0.0.1/a.png".to_owned(), "private"),
        ("http://192.168.1.1/a.png".to_owned(), "private"),
        (
            "http://169.254.169.254/latest/meta-data".to_owned(),
            "link-local",
        ),
        ("http://100.64.0.1/a.png".to_owned(), "CGNAT"),
        ("http://0.0.0.0/a.png".to_owned(), "unspecified"),
        ("http://[fd00::1]/a.png".to_owned(), "private"),
        ("http://[fe80::1]/a.png".to_owned(), "link-local"),
    ] {
        assert_refused(
            run(&images(&[url]), &star).await,
            400,
            "images.0",
            &[kind, "media_allow_hosts"],
        );
    }
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_host_outside_the_list_is_refused_without_a_lookup() {
    let media = images(&[
        "http://images.example/a.png".into(),
        "https://127.0.0.1.nip.example/a.png".into(),
    ]);
    assert_refused(
        run(&media, &allowing(&["127.0.0.1", "cdn.example"])).await,
        400,
        "images.0",
        &["host images.example is not in media_allow_hosts"],
    );
}

#[tokio::test]
async fn redirects_inside_the_list_are_followed() {
    let server = serve(|path, addr| match path {
        "/a" => redirect("/b"),
        "/b" => redirect(&format!("http://{addr}/c.png")),
        _ => ok("image/png", &png(2, 2)),
    })
    .await;
    let blobs = run(&images(&[server.url("/a")]), &allowing(&["127.0.0.1"]))
        .await
        .unwrap();
    assert_eq!(blobs[0].bytes, png(2, 2));
    assert_eq!(server.hits(), 3);
}

#[tokio::test]
async fn a_redirect_to_a_host_outside_the_list_is_refused() {
    let server = serve(|_, _| redirect("http://elsewhere.example/a.png")).await;
    assert_refused(
        run(&images(&[server.url("/a")]), &allowing(&["127.0.0.1"])).await,
        400,
        "images.0",
        &[
            "after a redirect from 127.0.0.1",
            "host elsewhere.example is not in media_allow_hosts",
        ],
    );
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn a_redirect_to_loopback_is_refused_when_star_lets_it_through() {
    let server = serve(|path, addr| match path {
        "/by-name" => redirect(&format!("http://localhost:{}/x", addr.port())),
        "/by-ip" => redirect(&format!("http://127.0.0.2:{}/x", addr.port())),
        "/metadata" => redirect("http://169.254.169.254/latest/meta-data"),
        "/file" => redirect("file:///etc/passwd"),
        _ => ok("image/png", &png(1, 1)),
    })
    .await;
    // The test server is named, so the first hop reaches it; where it points is only under `*`.
    let policy = allowing(&["*", "127.0.0.1"]);
    for path in ["/by-name", "/by-ip", "/metadata"] {
        assert_refused(
            run(&images(&[server.url(path)]), &policy).await,
            400,
            "images.0",
            &["after a redirect from 127.0.0.1", "address"],
        );
    }
    // Nor does a redirect open another scheme.
    assert_refused(
        run(&images(&[server.url("/file")]), &policy).await,
        400,
        "images.0",
        &["file: URLs are not fetched"],
    );
    assert_eq!(server.hits(), 4);
}

#[tokio::test]
async fn a_redirect_loop_stops_after_the_limit() {
    let server = serve(|_, _| redirect("/again")).await;
    assert_refused(
        run(&images(&[server.url("/a")]), &allowing(&["127.0.0.1"])).await,
        400,
        "images.0",
        &["more than 3 redirects"],
    );
    assert_eq!(server.hits(), MAX_REDIRECTS + 1);
}

#[tokio::test]
async fn a_content_length_over_the_cap_is_refused_before_the_body() {
    let policy = MediaPolicy {
        max_item_bytes: 1000,
        ..allowing(&["127.0.0.1"])
    };
    let server = serve(|_, _| ok("image/png", &[0; 1001])).await;
    assert_refused(
        run(&images(&[server.url("/big.png")]), &policy).await,
        413,
        "images.0",
        &["1001 bytes, over the limit of 1000 bytes (max_media_bytes)"],
    );
}

#[tokio::test]
async fn a_body_without_content_length_is_cut_at_the_cap() {
    let policy = MediaPolicy {
        max_item_bytes: 1000,
        ..allowing(&["127.0.0.1"])
    };
    let server = serve(|path, _| match path {
        // Close-delimited: no length announced, 20 x 100 bytes sent.
        "/close" => Reply::Trickle {
            head: b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n"
                .to_vec(),
            chunk: vec![7; 100],
            count: 20,
            pause: Duration::from_millis(1),
        },
        // Chunked, 20 chunks of 100 bytes.
        _ => Reply::Trickle {
            head:
                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec(),
            chunk: [&b"64\r\n"[..], &[7; 100], b"\r\n"].concat(),
            count: 20,
            pause: Duration::from_millis(1),
        },
    })
    .await;
    for path in ["/close", "/chunked"] {
        assert_refused(
            run(&images(&[server.url(path)]), &policy).await,
            413,
            "images.0",
            &["larger than the limit of 1000 bytes"],
        );
    }
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_is_a_400() {
    let server = serve(|_, _| {
        Reply::Raw(
            b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\nConnection: close\r\n\r\nshort".to_vec(),
        )
    })
    .await;
    let media = Media {
        audio: vec![server.url("/a.wav")],
        ..Media::default()
    };
    assert_refused(
        run(&media, &allowing(&["127.0.0.1"])).await,
        400,
        "audio.0",
        &["reading the body from 127.0.0.1 failed"],
    );
}

#[tokio::test]
async fn a_slow_server_is_a_400_within_the_timeout() {
    let server = serve(|path, _| match path {
        "/slow-head" => {
            Reply::Delayed(Duration::from_secs(10), b"HTTP/1.1 200 OK\r\n\r\n".to_vec())
        }
        // The head at once, then a byte every 100 ms of a 1000-byte body.
        _ => Reply::Trickle {
            head: b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\n".to_vec(),
            chunk: vec![0],
            count: 1000,
            pause: Duration::from_millis(100),
        },
    })
    .await;
    let policy = MediaPolicy {
        fetch_timeout: Duration::from_millis(300),
        ..allowing(&["127.0.0.1"])
    };
    for path in ["/slow-head", "/slow-body"] {
        let started = Instant::now();
        let result = run(&images(&[server.url(path)]), &policy).await;
        let took = started.elapsed();
        assert_refused(
            result,
            400,
            "images.0",
            &["took longer than 0.3 s (media_fetch_timeout_secs)"],
        );
        assert!(took < Duration::from_secs(2), "{path}: {took:?}");
    }
}

#[tokio::test]
async fn an_error_status_is_a_400_naming_the_position() {
    let server = serve(|path, _| match path {
        "/missing.png" => status("404 Not Found"),
        _ => status("500 Internal Server Error"),
    })
    .await;
    let policy = allowing(&["127.0.0.1"]);
    let media = images(&[data("image/png", &png(1, 1)), server.url("/missing.png")]);
    assert_refused(
        run(&media, &policy).await,
        400,
        "images.1",
        &["images.1: 127.0.0.1 answered 404 Not Found"],
    );
    assert_refused(
        run(&images(&[server.url("/boom")]), &policy).await,
        400,
        "images.0",
        &["answered 500"],
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_400() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    assert_refused(
        run(
            &images(&[format!("http://{addr}/a.png")]),
            &allowing(&["127.0.0.1"]),
        )
        .await,
        400,
        "images.0",
        &["cannot fetch from 127.0.0.1"],
    );
}

#[tokio::test]
async fn a_failed_tls_handshake_is_a_400() {
    // A plain-HTTP server behind an https URL: it answers the ClientHello with an HTTP error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/a.png", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                .await;
            let _ = stream.shutdown().await;
        }
    });
    assert_refused(
        run(&images(&[url]), &allowing(&["127.0.0.1"])).await,
        400,
        "images.0",
        &["cannot fetch from 127.0.0.1"],
    );
}

#[tokio::test]
async fn a_served_type_of_another_kind_is_a_400() {
    let server = serve(|_, _| ok("text/html; charset=utf-8", b"<html>login</html>")).await;
    let media = Media {
        videos: vec![server.url("/v.mp4")],
        ..Media::default()
    };
    assert_refused(
        run(&media, &allowing(&["127.0.0.1"])).await,
        400,
        "videos.0",
        &["text/html", "not a video type"],
    );
}

#[tokio::test]
async fn concurrent_fetches_come_back_in_request_order() {
    // The first item is the slowest to arrive.
    let server = serve(|path, _| {
        let i: u64 = path.trim_start_matches('/').parse().unwrap_or(0);
        let Reply::Raw(bytes) = ok("image/png", &png(i as u32 + 1, 1)) else {
            unreachable!()
        };
        Reply::Delayed(Duration::from_millis(150 - 30 * i), bytes)
    })
    .await;
    let urls: Vec<String> = (0..5).map(|i| server.url(&format!("/{i}"))).collect();
    let blobs = run(&images(&urls), &allowing(&["127.0.0.1"]))
        .await
        .unwrap();
    let widths: Vec<_> = blobs
        .iter()
        .map(|b| image::read_header(&b.bytes).unwrap().width)
        .collect();
    assert_eq!(widths, [1, 2, 3, 4, 5]);
    assert_eq!(
        blobs.iter().map(|b| b.index).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
}

// ---- metrics ---------------------------------------------------------------------------------

#[test]
fn metrics_count_items_by_kind_and_fetch_failures_by_reason() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let server = serve(|path, _| match path {
                "/ok.png" => ok("image/png", &png(1, 1)),
                _ => status("404 Not Found"),
            })
            .await;
            let policy = allowing(&["127.0.0.1"]);
            let media = Media {
                images: vec![data("image/png", &png(1, 1)), server.url("/ok.png")],
                audio: vec![data("audio/wav", b"a")],
                ..Media::default()
            };
            run(&media, &policy).await.unwrap();
            run(&images(&[server.url("/gone.png")]), &policy)
                .await
                .unwrap_err();
            run(&images(&[server.url("/a.png")]), &MediaPolicy::default())
                .await
                .unwrap_err();
            run(&images(&["http://elsewhere.example/".into()]), &policy)
                .await
                .unwrap_err();
        })
    });
    // "name{label=value}" and its count, for every counter.
    let mut counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let key = key.key();
                let labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                Some((format!("{}{{{}}}", key.name(), labels.join(",")), n))
            }
            _ => None,
        })
        .collect();
    counters.sort();
    let expected = [
        ("decision_media_fetch_failures_total{reason=disabled}", 1),
        (
            "decision_media_fetch_failures_total{reason=host_not_allowed}",
            1,
        ),
        ("decision_media_fetch_failures_total{reason=status}", 1),
        ("decision_media_items_total{modality=audio}", 1),
        ("decision_media_items_total{modality=image}", 2),
    ]
    .map(|(k, n)| (k.to_owned(), n));
    assert_eq!(counters, expected);
}
