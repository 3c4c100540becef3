//! The record table of a v2 store (docs/FORMAT.md, "Record table"): where each stored record
//! lies in the image section, how long it is and how it is encoded. Records lie back to back
//! in record order, each at a multiple of 64 bytes from the section's start, so the table
//! has exactly one valid value for given lengths: [`check_table`] recomputes every offset
//! and bounds every length before a reader uses one.

use crate::error::FormatError;
use crate::format::RECORD_ALIGN;

/// Bytes of one table entry: offset (u64), length (u32), encoding (u8), 3 zero bytes.
pub const ENTRY_SIZE: u64 = 16;

/// How one record's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The height × width × channels uint8 pixels, as in a v1 store.
    Raw,
    /// A baseline JPEG of the record (grayscale for 1 channel, YCbCr for 3), always
    /// shorter than the raw pixels: a writer keeps a record raw when encoding does not pay.
    Jpeg,
}

impl Encoding {
    pub fn code(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Jpeg => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<Encoding> {
        match code {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Jpeg),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Jpeg => "jpeg",
        }
    }
}

/// How many records of a table are stored each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodingCounts {
    pub raw: u64,
    pub jpeg: u64,
}

/// One record's place in the image section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// From the start of the image section; a multiple of 64.
    pub offset: u64,
    pub length: u32,
    pub encoding: Encoding,
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_SIZE as usize] {
        let mut b = [0u8; ENTRY_SIZE as usize];
        b[..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b[12] = self.encoding.code();
        b
    }

    /// Reads an entry of a table [`check_table`] accepted (unknown codes read as raw).
    pub fn decode(b: &[u8]) -> Entry {
        Entry {
            offset: u64::from_le_bytes(b[..8].try_into().unwrap()),
            length: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            encoding: Encoding::from_code(b[12]).unwrap_or(Encoding::Raw),
        }
    }

    /// Where the next record starts: this one's end rounded up to 64.
    pub fn next_offset(&self) -> Option<u64> {
        let end = self.offset.checked_add(u64::from(self.length))?;
        Some(end.checked_add(RECORD_ALIGN - 1)? & !(RECORD_ALIGN - 1))
    }
}

/// Checks a whole table against the store's image size and the image section's length:
/// every entry at the offset the ones before it imply, a known encoding with zero reserved
/// bytes, a raw record exactly `image_len` bytes, an encoded one 1 to `image_len - 1` bytes,
/// and the last record ending where the section does. One pass, no allocation; returns how
/// many records are stored each way.
pub fn check_table(
    table: &[u8],
    image_len: u64,
    records_len: u64,
) -> Result<EncodingCounts, FormatError> {
    let mut counts = EncodingCounts::default();
    let bad =
        |i: usize, what: String| FormatError::Layout(format!("record table entry {i}: {what}"));
    let mut expected = 0u64;
    for (i, raw) in table.chunks_exact(ENTRY_SIZE as usize).enumerate() {
        let encoding = Encoding::from_code(raw[12])
            .ok_or_else(|| bad(i, format!("unknown encoding code {}", raw[12])))?;
        if raw[13..].iter().any(|&b| b != 0) {
            return Err(bad(i, "reserved bytes are not zero".into()));
        }
        let entry = Entry::decode(raw);
        if entry.offset != expected {
            return Err(bad(
                i,
                format!(
                    "offset {} where the records before it end at {expected}",
                    entry.offset
                ),
            ));
        }
        let length = u64::from(entry.length);
        match encoding {
            Encoding::Raw if length != image_len => {
                return Err(bad(
                    i,
                    format!("a raw record of {length} bytes, expected {image_len}"),
                ))
            }
            Encoding::Jpeg if length == 0 || length >= image_len => {
                return Err(bad(
                    i,
                    format!(
                    "an encoded record of {length} bytes, not between 1 and {} (shorter than raw)",
                    image_len.saturating_sub(1)
                ),
                ))
            }
            Encoding::Raw => counts.raw += 1,
            Encoding::Jpeg => counts.jpeg += 1,
        }
        expected = entry
            .next_offset()
            .filter(|&next| next <= records_len)
            .ok_or_else(|| bad(i, format!("ends past the {records_len}-byte image section")))?;
    }
    if expected != records_len {
        return Err(FormatError::Layout(format!(
            "the record table's records end at {expected}, but the image section is {records_len} bytes"
        )));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A valid table for these (length, encoding) records, and its image section length.
    fn table_of(records: &[(u32, Encoding)]) -> (Vec<u8>, u64) {
        let mut bytes = Vec::new();
        let mut offset = 0;
        for &(length, encoding) in records {
            let entry = Entry {
                offset,
                length,
                encoding,
            };
            bytes.extend_from_slice(&entry.encode());
            offset = entry.next_offset().unwrap();
        }
        (bytes, offset)
    }

    #[test]
    fn a_mixed_table_is_accepted_and_each_lie_refused() {
        let image_len = 300;
        let (table, len) = table_of(&[
            (300, Encoding::Raw),
            (17, Encoding::Jpeg),
            (299, Encoding::Jpeg),
            (300, Encoding::Raw),
        ]);
        assert_eq!(len, 320 + 64 + 320 + 320);
        let counts = check_table(&table, image_len, len).unwrap();
        assert_eq!(counts, EncodingCounts { raw: 2, jpeg: 2 });
        let refused = |edit: &dyn Fn(&mut Vec<u8>), records_len: u64| {
            let mut t = table.clone();
            edit(&mut t);
            check_table(&t, image_len, records_len)
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&|t| t[16] = 0, len).contains("entry 1: offset 256"));
        assert!(refused(&|t| t[28] = 7, len).contains("unknown encoding code 7"));
        assert!(refused(&|t| t[31] = 1, len).contains("reserved bytes"));
        // A raw record that lies about its length, an encoded one as long as raw.
        assert!(refused(&|t| t[8] = 45, len).contains("a raw record of 301"));
        assert!(
            refused(&|t| t[40..44].copy_from_slice(&300u32.to_le_bytes()), len)
                .contains("an encoded record of 300 bytes")
        );
        assert!(
            refused(&|t| t[24..28].copy_from_slice(&0u32.to_le_bytes()), len)
                .contains("an encoded record of 0 bytes")
        );
        assert!(refused(&|_| {}, len - 64).contains("ends past"));
        assert!(refused(&|_| {}, len + 64).contains("end at"));
    }

    proptest! {
        /// Whatever the bytes, checking a table never panics, and one it accepts places
        /// every record inside the section, in order, without overlap.
        #[test]
        fn any_table_is_checked_without_panicking(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            image_len in 1u64..400,
            records_len in 0u64..2000,
        ) {
            let table = &bytes[..bytes.len() / 16 * 16];
            if check_table(table, image_len, records_len).is_ok() {
                let mut end = 0;
                for raw in table.chunks_exact(16) {
                    let e = Entry::decode(raw);
                    prop_assert!(e.offset >= end && e.offset % 64 == 0);
                    end = e.offset + u64::from(e.length);
                    prop_assert!(end <= records_len);
                }
            }
        }

        /// Every table a writer makes is accepted.
        #[test]
        fn every_written_table_is_accepted(
            lengths in proptest::collection::vec((1u32..500, any::<bool>()), 0..50),
        ) {
            let image_len = 500;
            let records: Vec<(u32, Encoding)> = lengths
                .iter()
                .map(|&(l, raw)| if raw { (500, Encoding::Raw) } else { (l.min(499), Encoding::Jpeg) })
                .collect();
            let (table, len) = table_of(&records);
            prop_assert!(check_table(&table, image_len, len).is_ok());
        }
    }
}
