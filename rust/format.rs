//! Store format v1 and v2: the fixed 4096-byte header and the layout of the sections. A v1
//! store holds raw records at a fixed stride; a v2 store holds records of any length (raw or
//! encoded) and a record table saying where each lies (`table.rs`).
//!
//! `docs/FORMAT.md` is the specification; this file is its executable form. Every
//! number read from a file is validated here, with overflow-checked arithmetic,
//! before anything else touches the file.

use crate::error::FormatError;
use xxhash_rust::xxh3::xxh3_64;

pub const MAGIC: [u8; 8] = *b"FASTLOAD";
/// The version of a store of raw records at a fixed stride (every store before v2).
pub const VERSION: u32 = 1;
/// The version of a store with a record table: records of any length, raw or encoded.
pub const VERSION_TABLE: u32 = 2;
/// Size of the header, and the alignment of the image section.
pub const HEADER_SIZE: usize = 4096;
/// Record stride granularity: every record starts on a 64-byte (cache-line) boundary.
pub const RECORD_ALIGN: u64 = 64;
/// Alignment of the sections after the image section.
pub const SECTION_ALIGN: u64 = 64;
/// Largest metadata section accepted (64 MiB): enough for millions of source names,
/// small enough that a lying length cannot make a reader allocate without bound.
pub const MAX_META_LEN: u64 = 64 << 20;
/// Most JSON values (objects, arrays, strings, numbers, ...) a reader turns into a tree:
/// a 64 MiB section of `{}`s would otherwise cost gigabytes as objects. Four million
/// leaves room for the `sources` list of a multi-million-image pack.
pub const MAX_META_VALUES: u64 = 4_000_000;
/// Deepest nesting of metadata a reader turns into a tree (the top-level object is level 1).
pub const MAX_META_DEPTH: u32 = 64;
/// Bytes per label and per checksum.
pub const LABEL_SIZE: u64 = 8;
pub const CHECKSUM_SIZE: u64 = 8;
/// Byte offset of the header checksum: the last 8 bytes of the header.
const HEADER_CHECKSUM_AT: usize = HEADER_SIZE - 8;
/// Bytes of a v1 header that carry fields; the rest up to the checksum must be zero.
const FIELDS_END: usize = 120;
/// Bytes of a v2 header that carry fields: v1's and the record table section.
const FIELDS_END_TABLE: usize = 136;

/// The element type of a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelDtype {
    Float64,
    Int64,
}

impl LabelDtype {
    pub fn code(self) -> u8 {
        match self {
            LabelDtype::Float64 => 1,
            LabelDtype::Int64 => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(LabelDtype::Float64),
            2 => Some(LabelDtype::Int64),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LabelDtype::Float64 => "float64",
            LabelDtype::Int64 => "int64",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "float64" => Some(LabelDtype::Float64),
            "int64" => Some(LabelDtype::Int64),
            _ => None,
        }
    }
}

/// Pixel element type code for uint8, the only pixel type of format v1.
pub const PIXEL_UINT8: u8 = 1;

/// A byte range of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Section {
    pub offset: u64,
    pub length: u64,
}

impl Section {
    fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// The decoded header. Construct with [`Header::new`] (writer) or [`Header::decode`] (reader).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub count: u64,
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    pub label_dtype: LabelDtype,
    pub stride: u64,
    pub images: Section,
    pub labels: Section,
    pub checksums: Section,
    pub meta: Section,
    pub file_length: u64,
    /// The record table of a v2 store (`table.rs`); None in a v1 store. In a v2 store the
    /// image section holds the stored records back to back, each at a multiple of 64 bytes.
    pub table: Option<Section>,
}

/// Rounds `value` up to a multiple of `align` (a power of two), or None on overflow.
fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// Bytes of one image: height × width × channels, overflow-checked.
pub fn image_bytes(height: u32, width: u32, channels: u32) -> Option<u64> {
    (height as u64)
        .checked_mul(width as u64)?
        .checked_mul(channels as u64)
}

impl Header {
    /// Lays out a store of `count` records with `meta_len` bytes of metadata.
    pub fn new(
        count: u64,
        shape: (u32, u32, u32),
        label_dtype: LabelDtype,
        meta_len: u64,
    ) -> Result<Header, FormatError> {
        Header::lay_out(count, shape, label_dtype, None, meta_len)
    }

    /// Lays out a v2 store of `count` records whose stored bytes, each at a multiple of 64,
    /// take `records_len` bytes, followed by their record table.
    pub fn new_with_table(
        count: u64,
        shape: (u32, u32, u32),
        label_dtype: LabelDtype,
        records_len: u64,
        meta_len: u64,
    ) -> Result<Header, FormatError> {
        Header::lay_out(count, shape, label_dtype, Some(records_len), meta_len)
    }

    /// The one layout computation, shared by writers and by the reader's check: v1 when
    /// `records_len` is None (the image section is `count` strides), v2 otherwise.
    fn lay_out(
        count: u64,
        (height, width, channels): (u32, u32, u32),
        label_dtype: LabelDtype,
        records_len: Option<u64>,
        meta_len: u64,
    ) -> Result<Header, FormatError> {
        let overflow = || FormatError::Layout("store size overflows 64 bits".into());
        check_shape(height, width, channels)?;
        if meta_len > MAX_META_LEN {
            return Err(FormatError::Layout(format!(
                "metadata is {meta_len} bytes, more than the {MAX_META_LEN}-byte limit"
            )));
        }
        let stride = align_up(
            image_bytes(height, width, channels).ok_or_else(overflow)?,
            RECORD_ALIGN,
        )
        .ok_or_else(overflow)?;
        let images_len = match records_len {
            None => stride.checked_mul(count).ok_or_else(overflow)?,
            Some(len) if len % RECORD_ALIGN != 0 => {
                return Err(FormatError::Layout(format!(
                    "record section of {len} bytes is not a multiple of {RECORD_ALIGN}"
                )))
            }
            Some(len) => len,
        };
        let images = Section {
            offset: HEADER_SIZE as u64,
            length: images_len,
        };
        let next = |prev: Section, length: u64| -> Result<Section, FormatError> {
            let offset =
                align_up(prev.end().ok_or_else(overflow)?, SECTION_ALIGN).ok_or_else(overflow)?;
            Ok(Section { offset, length })
        };
        let table = match records_len {
            None => None,
            Some(_) => Some(next(
                images,
                count
                    .checked_mul(crate::table::ENTRY_SIZE)
                    .ok_or_else(overflow)?,
            )?),
        };
        let labels = next(
            table.unwrap_or(images),
            count.checked_mul(LABEL_SIZE).ok_or_else(overflow)?,
        )?;
        let checksums = next(
            labels,
            count.checked_mul(CHECKSUM_SIZE).ok_or_else(overflow)?,
        )?;
        let meta = next(checksums, meta_len)?;
        let file_length = meta.end().ok_or_else(overflow)?;
        Ok(Header {
            count,
            height,
            width,
            channels,
            label_dtype,
            stride,
            images,
            labels,
            checksums,
            meta,
            file_length,
            table,
        })
    }

    /// The format version this header is written as: 2 with a record table, else 1.
    pub fn version(&self) -> u32 {
        if self.table.is_some() {
            VERSION_TABLE
        } else {
            VERSION
        }
    }

    /// Bytes of one image without the stride padding.
    pub fn image_len(&self) -> usize {
        (self.height as usize) * (self.width as usize) * (self.channels as usize)
    }

    /// Encodes the header into its 4096 bytes, header checksum included.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        let mut w = Cursor { buf: &mut b, at: 0 };
        w.put(&MAGIC);
        w.put(&self.version().to_le_bytes());
        w.put(&(HEADER_SIZE as u32).to_le_bytes());
        w.put(&self.count.to_le_bytes());
        w.put(&self.height.to_le_bytes());
        w.put(&self.width.to_le_bytes());
        w.put(&self.channels.to_le_bytes());
        w.put(&[PIXEL_UINT8, self.label_dtype.code(), 0, 0]);
        w.put(&self.stride.to_le_bytes());
        for s in [self.images, self.labels, self.checksums, self.meta] {
            w.put(&s.offset.to_le_bytes());
            w.put(&s.length.to_le_bytes());
        }
        w.put(&self.file_length.to_le_bytes());
        debug_assert_eq!(w.at, FIELDS_END);
        if let Some(table) = self.table {
            w.put(&table.offset.to_le_bytes());
            w.put(&table.length.to_le_bytes());
            debug_assert_eq!(w.at, FIELDS_END_TABLE);
        }
        let sum = xxh3_64(&b[..HEADER_CHECKSUM_AT]);
        b[HEADER_CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes and validates a header against the actual file length.
    ///
    /// Checks, in order: the magic as far as the buffer holds it, length of the buffer, magic,
    /// version, header checksum,
    /// reserved bytes, shape and dtypes, stride, and every section's bounds.
    pub fn decode(bytes: &[u8], actual_file_length: u64) -> Result<Header, FormatError> {
        // A short file that does not start as a store (a CSV, a text) is not a store, not a
        // truncated one; an empty file, or a store cut inside its header, is truncated.
        let held = bytes.len().min(MAGIC.len());
        if bytes[..held] != MAGIC[..held] {
            return Err(FormatError::Magic);
        }
        if bytes.len() < HEADER_SIZE || actual_file_length < HEADER_SIZE as u64 {
            return Err(FormatError::Truncated(format!(
                "the file is {actual_file_length} bytes, shorter than the {HEADER_SIZE}-byte header"
            )));
        }
        let b = &bytes[..HEADER_SIZE];
        if b[..8] != MAGIC {
            return Err(FormatError::Magic);
        }
        let mut r = Reader { buf: b, at: 8 };
        let version = r.u32();
        if version != VERSION && version != VERSION_TABLE {
            return Err(FormatError::Version(version));
        }
        let stored_sum = u64::from_le_bytes(b[HEADER_CHECKSUM_AT..].try_into().unwrap());
        if xxh3_64(&b[..HEADER_CHECKSUM_AT]) != stored_sum {
            return Err(FormatError::HeaderChecksum);
        }
        let header_size = r.u32();
        if header_size as usize != HEADER_SIZE {
            return Err(FormatError::Field(format!(
                "header size is {header_size}, expected {HEADER_SIZE}"
            )));
        }
        let count = r.u64();
        let (height, width, channels) = (r.u32(), r.u32(), r.u32());
        let dtypes = r.take4();
        let stride = r.u64();
        let mut sections = [Section::default(); 4];
        for s in sections.iter_mut() {
            *s = Section {
                offset: r.u64(),
                length: r.u64(),
            };
        }
        let file_length = r.u64();
        let (table, fields_end) = if version == VERSION_TABLE {
            let table = Section {
                offset: r.u64(),
                length: r.u64(),
            };
            (Some(table), FIELDS_END_TABLE)
        } else {
            (None, FIELDS_END)
        };
        if b[fields_end..HEADER_CHECKSUM_AT].iter().any(|&x| x != 0)
            || dtypes[2] != 0
            || dtypes[3] != 0
        {
            return Err(FormatError::Field(
                "reserved header bytes are not zero".into(),
            ));
        }
        check_shape(height, width, channels)?;
        if dtypes[0] != PIXEL_UINT8 {
            return Err(FormatError::Field(format!(
                "unknown pixel dtype code {}",
                dtypes[0]
            )));
        }
        let label_dtype = LabelDtype::from_code(dtypes[1])
            .ok_or_else(|| FormatError::Field(format!("unknown label dtype code {}", dtypes[1])))?;
        if file_length != actual_file_length {
            return Err(if actual_file_length < file_length {
                FormatError::Truncated(format!(
                    "the file is {actual_file_length} bytes but its header says {file_length}"
                ))
            } else {
                FormatError::Layout(format!(
                    "the file is {actual_file_length} bytes but its header says {file_length}: trailing bytes"
                ))
            });
        }
        if sections[3].length > MAX_META_LEN {
            return Err(FormatError::Layout(format!(
                "metadata section is {} bytes, more than the {MAX_META_LEN}-byte limit",
                sections[3].length
            )));
        }
        // The only valid layout for these fields is the one the writer computes:
        // recompute it and compare, which checks alignment, stride, section sizes,
        // ordering, overlap and bounds in one place.
        let expected = Header::lay_out(
            count,
            (height, width, channels),
            label_dtype,
            table.map(|_| sections[0].length),
            sections[3].length,
        )?;
        if let (Some(got), Some(want)) = (table, expected.table) {
            if got != want {
                return Err(FormatError::Layout(format!(
                    "record table at {}+{} does not match the layout for {count} records (expected {}+{})",
                    got.offset, got.length, want.offset, want.length
                )));
            }
        }
        let names = ["image", "label", "checksum", "metadata"];
        let expected_sections = [
            expected.images,
            expected.labels,
            expected.checksums,
            expected.meta,
        ];
        if stride != expected.stride {
            return Err(FormatError::Layout(format!(
                "record stride is {stride}, expected {} for {height}x{width}x{channels}",
                expected.stride
            )));
        }
        for ((name, got), want) in names.iter().zip(sections).zip(expected_sections) {
            if got != want {
                return Err(FormatError::Layout(format!(
                    "{name} section at {}+{} does not match the layout for {count} records (expected {}+{})",
                    got.offset, got.length, want.offset, want.length
                )));
            }
        }
        if expected.file_length != file_length {
            return Err(FormatError::Layout(format!(
                "file length {file_length} does not match the sections (expected {})",
                expected.file_length
            )));
        }
        Ok(expected)
    }
}

fn check_shape(height: u32, width: u32, channels: u32) -> Result<(), FormatError> {
    if height == 0 || width == 0 {
        return Err(FormatError::Field(format!(
            "image size {height}x{width} has a zero side"
        )));
    }
    if !matches!(channels, 1 | 3 | 4) {
        return Err(FormatError::Field(format!(
            "{channels} channels; expected 1, 3 or 4"
        )));
    }
    Ok(())
}

struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take4(&mut self) -> [u8; 4] {
        let v = self.buf[self.at..self.at + 4].try_into().unwrap();
        self.at += 4;
        v
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take4())
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.buf[self.at..self.at + 8].try_into().unwrap());
        self.at += 8;
        v
    }
}

/// What a streaming pass over metadata found: how many JSON values and how deep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaShape {
    pub values: u64,
    pub depth: u32,
}

impl MetaShape {
    /// Checks the bounds a reader needs before it builds a tree of this metadata.
    pub fn check_bounds(&self) -> Result<(), FormatError> {
        if self.values > MAX_META_VALUES {
            return Err(FormatError::Meta(format!(
                "metadata has more than {MAX_META_VALUES} elements ({})",
                self.values
            )));
        }
        if self.depth > MAX_META_DEPTH {
            return Err(FormatError::Meta(format!(
                "metadata is nested {} levels deep, more than {MAX_META_DEPTH}",
                self.depth
            )));
        }
        Ok(())
    }
}

/// Validates `json` as one JSON object and measures it, in one pass that builds no tree:
/// memory stays constant whatever the metadata holds (serde_json stops nesting past 128).
pub fn meta_shape(json: &str) -> Result<MetaShape, FormatError> {
    if !json
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(FormatError::Meta("not a JSON object".into()));
    }
    let mut shape = MetaShape::default();
    let mut de = serde_json::Deserializer::from_str(json);
    let walked = serde::de::DeserializeSeed::deserialize(
        MetaWalk {
            depth: 1,
            shape: &mut shape,
        },
        &mut de,
    )
    .and_then(|()| de.end());
    walked.map_err(|e| FormatError::Meta(format!("not valid JSON: {e}")))?;
    Ok(shape)
}

/// Counts one JSON value and its children, keeping nothing.
struct MetaWalk<'a> {
    depth: u32,
    shape: &'a mut MetaShape,
}

impl MetaWalk<'_> {
    fn child(&mut self) -> MetaWalk<'_> {
        MetaWalk {
            depth: self.depth + 1,
            shape: self.shape,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for MetaWalk<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.shape.values += 1;
        self.shape.depth = self.shape.depth.max(self.depth);
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for MetaWalk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.child())?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            map.next_value_seed(self.child())?;
        }
        Ok(())
    }
}

/// Checksum of one record: xxh3-64 over its stored bytes (a raw image without padding, or an
/// encoded record as stored) then the 8 label bytes.
pub fn record_checksum(image: &[u8], label: [u8; 8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(image);
    h.update(&label);
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header::new(10, (384, 384, 3), LabelDtype::Float64, 100).unwrap()
    }

    #[test]
    fn round_trip() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes, h.file_length).unwrap(), h);
    }

    #[test]
    fn page_aligned_records_for_384() {
        let h = sample();
        assert_eq!(h.stride, 384 * 384 * 3);
        assert_eq!(h.stride % 4096, 0);
        assert_eq!(h.images.offset, 4096);
    }

    #[test]
    fn stride_rounds_up_to_64() {
        let h = Header::new(3, (5, 7, 3), LabelDtype::Int64, 0).unwrap();
        assert_eq!(h.stride, 128);
        assert_eq!(h.labels.offset % SECTION_ALIGN, 0);
        assert_eq!(h.meta.offset + h.meta.length, h.file_length);
    }

    #[test]
    fn a_table_header_round_trips_and_its_layout_is_checked() {
        let h = Header::new_with_table(10, (384, 384, 3), LabelDtype::Int64, 64 * 700, 50).unwrap();
        assert_eq!(h.version(), VERSION_TABLE);
        let table = h.table.unwrap();
        assert_eq!(table.offset, 4096 + 64 * 700);
        assert_eq!(h.labels.offset, table.offset + 192); // 10 entries of 16, padded to 64
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes, h.file_length).unwrap(), h);
        // A record section that is not a multiple of 64, and a table moved by one byte.
        assert!(Header::new_with_table(1, (2, 2, 3), LabelDtype::Int64, 65, 0).is_err());
        let mut b = bytes;
        b[120] += 1;
        reseal(&mut b);
        expect(
            &b,
            h.file_length,
            |e| matches!(e, FormatError::Layout(m) if m.contains("record table")),
        );
        // A v1 header with the table's bytes set has non-zero reserved bytes.
        let v1 = Header::new(10, (384, 384, 3), LabelDtype::Int64, 50).unwrap();
        let mut b = v1.encode();
        b[120] = 1;
        reseal(&mut b);
        expect(&b, v1.file_length, |e| matches!(e, FormatError::Field(_)));
    }

    #[test]
    fn the_issue_sizes() {
        let h = Header::new(250_000, (384, 384, 3), LabelDtype::Float64, 0).unwrap();
        assert_eq!(h.images.length + h.labels.length, 110_594_000_000);
    }

    fn expect(bytes: &[u8], len: u64, want: fn(&FormatError) -> bool) {
        let err = Header::decode(bytes, len).unwrap_err();
        assert!(want(&err), "unexpected error: {err}");
    }

    /// Re-seals a modified header so that the field checks, not the checksum, are what fails.
    fn reseal(b: &mut [u8; HEADER_SIZE]) {
        let sum = xxh3_64(&b[..HEADER_CHECKSUM_AT]);
        b[HEADER_CHECKSUM_AT..].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn every_validation_branch() {
        let h = sample();
        let good = h.encode();
        let len = h.file_length;
        expect(&good[..100], len, |e| {
            matches!(e, FormatError::Truncated(_))
        });
        expect(&good, 100, |e| matches!(e, FormatError::Truncated(_)));
        let mut b = good;
        b[0] = b'X';
        expect(&b, len, |e| matches!(e, FormatError::Magic));
        let mut b = good;
        b[8] = 3;
        expect(&b, len, |e| matches!(e, FormatError::Version(3)));
        let mut b = good;
        b[20] ^= 1;
        expect(&b, len, |e| matches!(e, FormatError::HeaderChecksum));
        let mutate = |at: usize, value: &[u8]| {
            let mut b = good;
            b[at..at + value.len()].copy_from_slice(value);
            reseal(&mut b);
            b
        };
        expect(&mutate(12, &[0, 2, 0, 0]), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(200, &[1]), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(24, &0u32.to_le_bytes()), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(32, &2u32.to_le_bytes()), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(36, &[9]), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(37, &[9]), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(38, &[1]), len, |e| {
            matches!(e, FormatError::Field(_))
        });
        expect(&mutate(40, &7u64.to_le_bytes()), len, |e| {
            matches!(e, FormatError::Layout(_))
        });
        // record count that no longer matches the sections
        expect(&mutate(16, &11u64.to_le_bytes()), len, |e| {
            matches!(e, FormatError::Layout(_))
        });
        // huge record count: overflow must be an error, not a panic
        expect(&mutate(16, &u64::MAX.to_le_bytes()), len, |e| {
            matches!(e, FormatError::Layout(_))
        });
        // a section moved
        expect(
            &mutate(64, &(h.labels.offset + 64).to_le_bytes()),
            len,
            |e| matches!(e, FormatError::Layout(_)),
        );
        // metadata beyond its bound
        expect(&mutate(104, &(MAX_META_LEN + 1).to_le_bytes()), len, |e| {
            matches!(e, FormatError::Layout(_))
        });
        // file shorter or longer than the header says
        expect(&good, len - 1, |e| matches!(e, FormatError::Truncated(_)));
        expect(&good, len + 1, |e| matches!(e, FormatError::Layout(_)));
    }

    #[test]
    fn label_dtypes_are_named_as_numpy_names_them() {
        for dtype in [LabelDtype::Float64, LabelDtype::Int64] {
            assert_eq!(LabelDtype::from_name(dtype.name()), Some(dtype));
        }
        assert_eq!(LabelDtype::Float64.name(), "float64");
        assert_eq!(LabelDtype::Int64.name(), "int64");
        for unknown in ["", "float32", "Int64", "int64 "] {
            assert_eq!(LabelDtype::from_name(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn the_limits_are_inclusive_and_the_errors_name_them() {
        // A file of exactly one header of zeros is a file that is not a store, not a short one.
        let zeros = [0u8; HEADER_SIZE];
        expect(&zeros, HEADER_SIZE as u64, |e| {
            matches!(e, FormatError::Magic)
        });
        // A short file that is no store (a CSV) is named as no store, not as a truncated one.
        let csv = b"path,label\na.png,1\n";
        expect(csv, csv.len() as u64, |e| matches!(e, FormatError::Magic));
        expect(b"", 0, |e| matches!(e, FormatError::Truncated(_)));
        // A file shorter than a header says so, whatever bytes the caller holds.
        let h = sample();
        let message = Header::decode(&h.encode(), 100).unwrap_err().to_string();
        assert!(
            message.contains("shorter than the 4096-byte header"),
            "{message}"
        );
        // Metadata of exactly the limit is a valid store; one byte more names the limit.
        let largest = Header::new(1, (2, 2, 3), LabelDtype::Int64, MAX_META_LEN).unwrap();
        assert_eq!(
            Header::decode(&largest.encode(), largest.file_length).unwrap(),
            largest
        );
        let mut b = largest.encode();
        b[104..112].copy_from_slice(&(MAX_META_LEN + 1).to_le_bytes());
        b[112..120].copy_from_slice(&(largest.file_length + 1).to_le_bytes());
        reseal(&mut b);
        let message = Header::decode(&b, largest.file_length + 1)
            .unwrap_err()
            .to_string();
        assert!(message.contains("-byte limit"), "{message}");
    }

    #[test]
    fn meta_shape_counts_values_and_depth() {
        let shape = meta_shape(r#" {"a": [1, {"b": null}, "x"], "c": 2.5}"#).unwrap();
        assert_eq!(
            shape,
            MetaShape {
                values: 7,
                depth: 4
            }
        );
        assert!(shape.check_bounds().is_ok());
        for bad in [
            "[1]",
            "{",
            r#"{"a": NaN}"#,
            "{} {}",
            r#"{"a": "\ud800"}"#,
            "",
        ] {
            assert!(
                matches!(meta_shape(bad), Err(FormatError::Meta(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn meta_bounds_name_the_excess() {
        let deep = format!("{}1{}", "[".repeat(64), "]".repeat(64));
        let deep = format!(r#"{{"a":{deep}}}"#);
        let err = meta_shape(&deep).unwrap().check_bounds().unwrap_err();
        assert!(err.to_string().contains("nested 66 levels deep"), "{err}");
        let many = format!(
            r#"{{"a":[{}]}}"#,
            vec!["{}"; MAX_META_VALUES as usize].join(",")
        );
        let err = meta_shape(&many).unwrap().check_bounds().unwrap_err();
        assert!(
            err.to_string().contains("more than 4000000 elements"),
            "{err}"
        );
        let at_the_limits = MetaShape {
            values: MAX_META_VALUES,
            depth: MAX_META_DEPTH,
        };
        assert!(at_the_limits.check_bounds().is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("FASTLOAD_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
        ))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200), len in any::<u64>()) {
            let _ = Header::decode(&bytes, len);
        }

        #[test]
        fn mutated_headers_never_panic(at in 8usize..HEADER_SIZE, value in any::<u8>(), seal in any::<bool>(), extra in 0u64..3) {
            let h = sample();
            let mut b = h.encode();
            b[at] = value;
            if seal { reseal(&mut b); }
            let result = Header::decode(&b, h.file_length + extra);
            if let Ok(decoded) = result {
                prop_assert_eq!(decoded.encode(), b);
            }
        }

        #[test]
        fn layout_round_trips(count in 0u64..100_000, h in 1u32..2000, w in 1u32..2000, c in prop::sample::select(vec![1u32, 3, 4]), meta in 0u64..10_000, int in any::<bool>()) {
            let dtype = if int { LabelDtype::Int64 } else { LabelDtype::Float64 };
            let header = Header::new(count, (h, w, c), dtype, meta).unwrap();
            prop_assert_eq!(header.stride % RECORD_ALIGN, 0);
            prop_assert!(header.stride >= image_bytes(h, w, c).unwrap());
            prop_assert_eq!(Header::decode(&header.encode(), header.file_length).unwrap(), header);
        }
    }
}
