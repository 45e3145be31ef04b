//! Big-endian TPM 2.0 marshalling primitives (TPM 2.0 Part 2): a bounds-checked reader that
//! never indexes, and a writer that refuses lengths its reader would refuse.

/// Why a TPM structure could not be parsed (or marshalled).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The input ended inside a field.
    #[error("{structure}: truncated at {field}")]
    Truncated {
        /// Structure being parsed, e.g. `TPMS_ATTEST`.
        structure: &'static str,
        /// Field that did not fit.
        field: &'static str,
    },
    /// Bytes were left after the structure.
    #[error("{structure}: {count} trailing bytes")]
    TrailingBytes {
        /// Structure being parsed.
        structure: &'static str,
        /// How many bytes were left.
        count: usize,
    },
    /// A sized field (TPM2B, list) is larger than the specification allows.
    #[error("{structure}: {field} is {size}, at most {max} allowed")]
    TooLong {
        /// Structure being parsed.
        structure: &'static str,
        /// The field.
        field: &'static str,
        /// Size or count found.
        size: usize,
        /// Largest size or count accepted.
        max: usize,
    },
    /// A selector or constant has a value this parser does not support.
    #[error("{structure}: {field} has unsupported value {value:#x}")]
    Unsupported {
        /// Structure being parsed.
        structure: &'static str,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u32,
    },
    /// A field is present but its value is not allowed.
    #[error("{structure}: {field} is invalid: {reason}")]
    Invalid {
        /// Structure being parsed.
        structure: &'static str,
        /// The field.
        field: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
}

/// A cursor over TPM wire bytes. Every read is bounds-checked; nothing indexes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    structure: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], structure: &'static str) -> Self {
        Self { buf, structure }
    }

    pub(crate) fn structure(&self) -> &'static str {
        self.structure
    }

    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ParseError> {
        let (head, tail) = self.buf.split_at_checked(n).ok_or(ParseError::Truncated {
            structure: self.structure,
            field,
        })?;
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ParseError> {
        let bytes = self.take(N, field)?;
        bytes.try_into().map_err(|_| ParseError::Truncated {
            structure: self.structure,
            field,
        })
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, ParseError> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, ParseError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, ParseError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, ParseError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// A TPM2B: a u16 size followed by that many bytes, at most `max`.
    pub(crate) fn tpm2b(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<&'a [u8], ParseError> {
        let size = usize::from(self.u16(field)?);
        if size > max {
            return Err(ParseError::TooLong {
                structure: self.structure,
                field,
                size,
                max,
            });
        }
        self.take(size, field)
    }

    /// Ends the parse: the structure must have consumed every byte.
    pub(crate) fn finish(self) -> Result<(), ParseError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ParseError::TrailingBytes {
                structure: self.structure,
                count: self.buf.len(),
            })
        }
    }
}

/// Builds TPM wire bytes; refuses what [`Reader`] would refuse.
pub(crate) struct Writer {
    buf: Vec<u8>,
    structure: &'static str,
}

impl Writer {
    pub(crate) fn new(structure: &'static str) -> Self {
        Self {
            buf: Vec::with_capacity(256),
            structure,
        }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }

    pub(crate) fn tpm2b(
        &mut self,
        field: &'static str,
        max: usize,
        data: &[u8],
    ) -> Result<(), ParseError> {
        let too_long = ParseError::TooLong {
            structure: self.structure,
            field,
            size: data.len(),
            max,
        };
        if data.len() > max {
            return Err(too_long);
        }
        let size = u16::try_from(data.len()).map_err(|_| too_long)?;
        self.u16(size);
        self.bytes(data);
        Ok(())
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reports_truncation_and_trailing_bytes() {
        let mut r = Reader::new(&[0, 1, 2], "T");
        assert_eq!(r.u16("a").unwrap(), 1);
        assert_eq!(
            r.u16("b").unwrap_err(),
            ParseError::Truncated {
                structure: "T",
                field: "b"
            }
        );
        let r = Reader::new(&[0], "T");
        assert_eq!(
            r.finish().unwrap_err(),
            ParseError::TrailingBytes {
                structure: "T",
                count: 1
            }
        );
    }

    #[test]
    fn tpm2b_enforces_its_maximum_both_ways() {
        let mut r = Reader::new(&[0, 3, 1, 2, 3], "T");
        assert!(matches!(
            r.tpm2b("f", 2),
            Err(ParseError::TooLong {
                size: 3,
                max: 2,
                ..
            })
        ));
        let mut w = Writer::new("T");
        assert!(w.tpm2b("f", 2, &[1, 2, 3]).is_err());
        w.tpm2b("f", 3, &[1, 2, 3]).unwrap();
        assert_eq!(w.finish(), vec![0, 3, 1, 2, 3]);
    }
}
