//! An image's format and size, read from its first bytes without decoding it, so that a small file
//! claiming a huge canvas (a decompression bomb) is refused before any decoder sees it.

/// The image formats the router passes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
    Webp,
    Gif,
    Bmp,
}

impl ImageFormat {
    pub fn mime(&self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Webp => "image/webp",
            ImageFormat::Gif => "image/gif",
            ImageFormat::Bmp => "image/bmp",
        }
    }

    fn name(&self) -> &'static str {
        match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Webp => "WebP",
            ImageFormat::Gif => "GIF",
            ImageFormat::Bmp => "BMP",
        }
    }

    /// The leading bytes that identify the format (`None` stands for any byte).
    fn magic(&self) -> &'static [Option<u8>] {
        const fn b(s: &[u8; 4]) -> [Option<u8>; 4] {
            [Some(s[0]), Some(s[1]), Some(s[2]), Some(s[3])]
        }
        const PNG: [Option<u8>; 8] = [
            Some(0x89),
            Some(b'P'),
            Some(b'N'),
            Some(b'G'),
            Some(b'\r'),
            Some(b'\n'),
            Some(0x1a),
            Some(b'\n'),
        ];
        const WEBP: [Option<u8>; 12] = {
            let riff = b(b"RIFF");
            let webp = b(b"WEBP");
            [
                riff[0], riff[1], riff[2], riff[3], None, None, None, None, webp[0], webp[1],
                webp[2], webp[3],
            ]
        };
        match self {
            ImageFormat::Png => &PNG,
            ImageFormat::Jpeg => &[Some(0xff), Some(0xd8), Some(0xff)],
            ImageFormat::Webp => &WEBP,
            ImageFormat::Gif => &[Some(b'G'), Some(b'I'), Some(b'F'), Some(b'8')],
            ImageFormat::Bmp => &[Some(b'B'), Some(b'M')],
        }
    }

    const ALL: [ImageFormat; 5] = [
        ImageFormat::Png,
        ImageFormat::Jpeg,
        ImageFormat::Webp,
        ImageFormat::Gif,
        ImageFormat::Bmp,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub format: ImageFormat,
    pub width: u64,
    pub height: u64,
}

impl ImageHeader {
    pub fn pixels(&self) -> u64 {
        self.width.saturating_mul(self.height)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageHeaderError {
    #[error("not a PNG, JPEG, WebP, GIF or BMP image")]
    Unrecognised,
    #[error("its {} header is truncated or corrupt", .0.name())]
    Corrupt(ImageFormat),
}

/// The format and size of an image from its header; the rest of the bytes are not looked at.
pub fn read_header(bytes: &[u8]) -> Result<ImageHeader, ImageHeaderError> {
    let format = sniff(bytes)?;
    let corrupt = ImageHeaderError::Corrupt(format);
    let (width, height) = match format {
        // imagesize reads a BMP's height as unsigned; a negative one (rows top-down) is valid.
        ImageFormat::Bmp => bmp_size(bytes).ok_or(corrupt.clone())?,
        ImageFormat::Png if bytes.get(12..16) != Some(b"IHDR") => return Err(corrupt),
        _ => {
            let size = imagesize::blob_size(bytes).map_err(|_| corrupt.clone())?;
            (size.width as u64, size.height as u64)
        }
    };
    if width == 0 || height == 0 {
        return Err(corrupt);
    }
    Ok(ImageHeader {
        format,
        width,
        height,
    })
}

/// The format whose magic the bytes start with; bytes that stop inside a magic are a truncated header.
fn sniff(bytes: &[u8]) -> Result<ImageFormat, ImageHeaderError> {
    let matches = |magic: &[Option<u8>]| {
        magic
            .iter()
            .zip(bytes)
            .all(|(m, b)| m.is_none_or(|m| m == *b))
    };
    for format in ImageFormat::ALL {
        let magic = format.magic();
        if !bytes.is_empty() && matches(magic) {
            return if bytes.len() < magic.len() {
                Err(ImageHeaderError::Corrupt(format))
            } else {
                Ok(format)
            };
        }
    }
    Err(ImageHeaderError::Unrecognised)
}

fn bmp_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    match u32_at(14)? {
        // OS/2 BITMAPCOREHEADER: unsigned 16-bit sizes.
        12 => Some((u16_at(18)? as u64, u16_at(20)? as u64)),
        dib if dib >= 40 => {
            let width = u32_at(18)? as i32;
            let height = u32_at(22)? as i32;
            (width > 0).then_some((width as u64, height.unsigned_abs() as u64))
        }
        _ => None,
    }
}

/// Headers of each format, for tests here and in the module.
#[cfg(test)]
pub mod samples {
    pub fn png(width: u32, height: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(width.to_be_bytes());
        b.extend(height.to_be_bytes());
        b.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
        b
    }

    pub fn jpeg(width: u16, height: u16) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8, 0xff, 0xe0, 0, 16];
        b.extend(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        b.extend([0xff, 0xc0, 0, 17, 8]);
        b.extend(height.to_be_bytes());
        b.extend(width.to_be_bytes());
        b.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        b
    }

    pub fn gif(width: u16, height: u16) -> Vec<u8> {
        let mut b = b"GIF89a".to_vec();
        b.extend(width.to_le_bytes());
        b.extend(height.to_le_bytes());
        b.extend([0, 0, 0, b';']);
        b
    }

    pub fn webp(width: u32, height: u32) -> Vec<u8> {
        let mut b = b"RIFF\x24\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
        b.extend(&(width - 1).to_le_bytes()[..3]);
        b.extend(&(height - 1).to_le_bytes()[..3]);
        b
    }

    pub fn bmp(width: i32, height: i32) -> Vec<u8> {
        let mut b = b"BM\0\0\0\0\0\0\0\0\x36\0\0\0".to_vec();
        b.extend(40u32.to_le_bytes());
        b.extend(width.to_le_bytes());
        b.extend(height.to_le_bytes());
        b.extend([1, 0, 24, 0]);
        b.extend([0; 24]);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    fn size(bytes: &[u8]) -> (ImageFormat, u64, u64) {
        let h = read_header(bytes).unwrap();
        (h.format, h.width, h.height)
    }

    #[test]
    fn reads_each_formats_size() {
        assert_eq!(size(&png(640, 480)), (ImageFormat::Png, 640, 480));
        assert_eq!(size(&jpeg(1920, 1080)), (ImageFormat::Jpeg, 1920, 1080));
        assert_eq!(size(&gif(7, 9)), (ImageFormat::Gif, 7, 9));
        assert_eq!(size(&webp(5000, 3)), (ImageFormat::Webp, 5000, 3));
        assert_eq!(size(&bmp(33, 44)), (ImageFormat::Bmp, 33, 44));
        // Top-down rows: a negative height.
        assert_eq!(size(&bmp(33, -44)), (ImageFormat::Bmp, 33, 44));
        assert_eq!(
            read_header(&png(70_000, 70_000)).unwrap().pixels(),
            4_900_000_000
        );
    }

    #[test]
    fn other_bytes_are_not_images() {
        for bytes in [
            &b"hello, world: not an image"[..],
            b"",
            b"II*\0\x08\0\0\0 a TIFF header",
            b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        ] {
            assert_eq!(read_header(bytes), Err(ImageHeaderError::Unrecognised));
        }
    }

    #[test]
    fn truncated_or_corrupt_headers_are_named() {
        let full = png(10, 10);
        for cut in [3, 8, 16, 20, 23] {
            assert_eq!(
                read_header(&full[..cut]),
                Err(ImageHeaderError::Corrupt(ImageFormat::Png)),
                "{cut} bytes"
            );
        }
        let mut no_ihdr = full.clone();
        no_ihdr[12..16].copy_from_slice(b"IDAT");
        assert_eq!(
            read_header(&no_ihdr),
            Err(ImageHeaderError::Corrupt(ImageFormat::Png))
        );
        let jpeg = jpeg(10, 10);
        assert_eq!(
            read_header(&jpeg[..12]),
            Err(ImageHeaderError::Corrupt(ImageFormat::Jpeg))
        );
        assert_eq!(
            read_header(&png(0, 10)),
            Err(ImageHeaderError::Corrupt(ImageFormat::Png))
        );
        assert_eq!(
            read_header(&bmp(-3, 10)),
            Err(ImageHeaderError::Corrupt(ImageFormat::Bmp))
        );
        assert_eq!(
            read_header(&gif(10, 10)[..9]),
            Err(ImageHeaderError::Corrupt(ImageFormat::Gif))
        );
    }
}
