//! Undoing the compression Pulsar producers apply to an entry's payload.
//!
//! The framings are the ones Pulsar clients write (`CompressionCodec*` in the Java client):
//! LZ4 a raw block without size prefix, ZLIB a zlib stream, ZSTD one zstd frame, SNAPPY a
//! raw snappy block. `MessageMetadata.uncompressed_size` gives the exact output size; no
//! decoder is allowed to produce more than that, nor more than [`MAX_UNCOMPRESSED_SIZE`].

use std::borrow::Cow;
use std::io::Read;

use crate::error::{FormatError, Result};

/// `CompressionType` values of PulsarApi.proto.
pub const NONE: u64 = 0;
pub const LZ4: u64 = 1;
pub const ZLIB: u64 = 2;
pub const ZSTD: u64 = 3;
pub const SNAPPY: u64 = 4;

/// The largest decompressed payload accepted (the Python decoder's default bound too).
pub const MAX_UNCOMPRESSED_SIZE: usize = 64 * 1024 * 1024;

fn bad(what: &str, e: impl std::fmt::Display) -> FormatError {
    FormatError::Compression(format!("{what}: {e}"))
}

/// Read at most `size + 1` bytes from `reader` and require exactly `size`.
fn read_exact_size(what: &str, reader: impl Read, size: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(size);
    let limit = u64::try_from(size).map_err(|e| bad(what, e))?.saturating_add(1);
    reader.take(limit).read_to_end(&mut out).map_err(|e| bad(what, e))?;
    if out.len() != size {
        return Err(bad(what, format!("inflated to {} bytes, expected {size}", out.len())));
    }
    Ok(out)
}

/// `data` decompressed per `compression` into exactly `size` bytes.
pub fn decompress(compression: u64, data: &[u8], size: u32) -> Result<Cow<'_, [u8]>> {
    if compression == NONE {
        return Ok(Cow::Borrowed(data));
    }
    let size = usize::try_from(size).map_err(|e| bad("size", e))?;
    if size > MAX_UNCOMPRESSED_SIZE {
        return Err(bad("size", format!("{size} bytes is above {MAX_UNCOMPRESSED_SIZE}")));
    }
    let out = match compression {
        LZ4 => {
            if size == 0 && data.len() <= 1 {
                return Ok(Cow::Owned(Vec::new()));
            }
            let mut out = vec![0u8; size];
            let n = lz4_flex::block::decompress_into(data, &mut out).map_err(|e| bad("lz4", e))?;
            if n != size {
                return Err(bad("lz4", format!("inflated to {n} bytes, expected {size}")));
            }
            out
        }
        ZLIB => read_exact_size("zlib", flate2::read::ZlibDecoder::new(data), size)?,
        ZSTD => {
            let decoder = ruzstd::decoding::StreamingDecoder::new(data).map_err(|e| bad("zstd", e))?;
            read_exact_size("zstd", decoder, size)?
        }
        SNAPPY => {
            let declared = snap::raw::decompress_len(data).map_err(|e| bad("snappy", e))?;
            if declared != size {
                return Err(bad("snappy", format!("block declares {declared} bytes, metadata says {size}")));
            }
            snap::raw::Decoder::new().decompress_vec(data).map_err(|e| bad("snappy", e))?
        }
        other => return Err(FormatError::Unsupported(format!("compression type {other}"))),
    };
    Ok(Cow::Owned(out))
}

/// The same payload compressed as a Pulsar producer would, for tests.
#[cfg(test)]
pub(crate) fn compress(compression: u64, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match compression {
        LZ4 => lz4_flex::block::compress(data),
        ZLIB => {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(data).unwrap();
            z.finish().unwrap()
        }
        ZSTD => ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest),
        SNAPPY => snap::raw::Encoder::new().compress_vec(data).unwrap(),
        _ => data.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(kind in 0u64..5, data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let packed = compress(kind, &data);
            let size = u32::try_from(data.len()).unwrap();
            prop_assert_eq!(&decompress(kind, &packed, size).unwrap()[..], &data[..]);
            if !data.is_empty() && kind != NONE {
                prop_assert!(decompress(kind, &packed, size - 1).is_err());
            }
        }

        #[test]
        fn garbage_is_an_error_never_a_panic(kind in 1u64..5, raw in proptest::collection::vec(any::<u8>(), 0..64), size in 0u32..256) {
            let _ = decompress(kind, &raw, size);
        }
    }

    #[test]
    fn oversized_and_unknown_are_refused() {
        assert!(decompress(ZLIB, b"", u32::MAX).is_err());
        assert!(matches!(decompress(9, b"x", 1), Err(FormatError::Unsupported(_))));
    }
}
