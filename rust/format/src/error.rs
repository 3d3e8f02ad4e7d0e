//! The one error type of the crate.

/// Why stored bytes could not be decoded into messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The bytes end before a field they announce.
    #[error("truncated: {0}")]
    Truncated(&'static str),
    /// The entry does not start with the 0x0e01 magic.
    #[error("bad magic {0:#06x}, expected 0x0e01")]
    BadMagic(u16),
    /// The CRC-32C over metadata and payload does not match.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    /// A protobuf message is malformed.
    #[error("malformed {message}: {reason}")]
    Protobuf { message: &'static str, reason: String },
    /// A string field is not UTF-8.
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    /// A compressed payload does not decompress to the declared size.
    #[error("compressed payload: {0}")]
    Compression(String),
    /// A batch's layout disagrees with its metadata.
    #[error("batch: {0}")]
    Batch(String),
    /// A well-formed entry this decoder does not turn into rows (encrypted, chunked, a marker).
    #[error("unsupported entry: {0}")]
    Unsupported(String),
    /// A column would outgrow its 32-bit offsets; flush the columns first.
    #[error("column data beyond {0} bytes")]
    TooLarge(usize),
}

/// The crate's result type.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;
