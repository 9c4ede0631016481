//! Reading and writing numpy `.npy` files (v1, little-endian, C order) with `npyz`.
//!
//! Dtypes: `<f4` f32, `<f2` f16, `<i4` i32, `<u4` u32, `|i1` i8, `|u1` u8, `<i2` i16, `<u2` u16,
//! `|b1` bool, and `|V2` for bf16 (what
//! `np.save` writes for an `ml_dtypes.bfloat16` array: two raw bytes per element). Big-endian
//! files (`>f4`) are refused with the `astype` that converts them.

use std::io::Write;
use std::path::Path;

use npyz::{DType as NpyDType, NpyFile, Order, TypeChar};
use tessel_plugin_api::array::{ArrayData, HostArray};
use tessel_plugin_api::ir::DType;

/// What went wrong with one `.npy` file; the host adds the path.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file could not be opened or read.
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    /// Bytes that do not start as a `.npy` file does.
    #[error("it is not a .npy file: it does not start with numpy's magic `\\x93NUMPY`\n  expected a file written by np.save")]
    Magic,
    /// A dtype tessel does not take.
    #[error(
        "its dtype is `{0}`, which tessel does not take\n  expected f32 (<f4), f16 (<f2), bf16 (|V2), i32 (<i4), u32 (<u4), i16 (<i2), u16 (<u2), i8 (|i1), u8 (|u1) or bool (|b1); convert with e.g. `x.astype(np.float32)`"
    )]
    Dtype(String),
    /// An array of Python objects (`np.save` of an object array: a pickle, not numbers).
    #[error(
        "it holds Python objects (dtype `{0}`), not numbers\n  save a numeric array, e.g. `np.save(path, np.asarray(x, dtype=np.float32))`"
    )]
    Object(String),
    /// A header that is not one plain dict with a shape tuple.
    #[error(
        "its header is not a plain numpy header (one dict: descr, fortran_order, shape)\n  expected a file written by np.save"
    )]
    Header,
    /// The shape in the header does not match the bytes after it.
    #[error(
        "its header says shape {shape}, but {bytes} bytes of data follow\n  expected a complete .npy file as np.save writes it"
    )]
    Truncated {
        /// The header's shape.
        shape: String,
        /// Bytes after the header.
        bytes: u64,
    },
    /// Fortran order.
    #[error("it is in Fortran order\n  expected C order; save `np.ascontiguousarray(x)`")]
    Fortran,
}

/// What every `.npy` file starts with.
const MAGIC: &[u8] = b"\x93NUMPY";

/// Reads a `.npy` file into a host array: the header first, then the data straight into the
/// array's memory (one copy, from the page cache), after the header's shape has been checked
/// against the file's length — a lying header is an error, not an out-of-memory abort.
pub fn read(path: &Path) -> Result<HostArray, NpyError> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    // Magic, version and the header's length (2 bytes in version 1, 4 after), then the header.
    let mut head = vec![0u8; len.min(12) as usize];
    file.read_exact(&mut head)?;
    if !head.starts_with(MAGIC) {
        return Err(NpyError::Magic);
    }
    let start = bytes_before_data(&head);
    if start > len || start > 1 << 20 {
        return Err(NpyError::Header);
    }
    head.resize(start as usize, 0);
    file.read_exact(&mut head[len.min(12) as usize..])?;
    let (dtype, shape) = header(&head, len - start)?;
    let mut array = HostArray::zeros(dtype, &shape);
    match array.le_bytes_mut() {
        Some(bytes) => file.read_exact(bytes)?,
        None => {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            array = HostArray::from_le_bytes(dtype, &shape, &bytes).map_err(|_| NpyError::Header)?;
        }
    }
    Ok(array)
}

/// Reads the bytes of a `.npy` file (one copy of the data).
pub fn read_bytes(bytes: &[u8]) -> Result<HostArray, NpyError> {
    if !bytes.starts_with(MAGIC) {
        return Err(NpyError::Magic);
    }
    let start = bytes_before_data(bytes).min(bytes.len() as u64);
    let (dtype, shape) = header(&bytes[..start as usize], bytes.len() as u64 - start)?;
    HostArray::from_le_bytes(dtype, &shape, &bytes[start as usize..]).map_err(|_| NpyError::Header)
}

/// The dtype and shape a `.npy` header (`head`: everything before the data) declares, checked
/// against the `data_len` bytes that follow it.
fn header(head: &[u8], data_len: u64) -> Result<(DType, Vec<usize>), NpyError> {
    check_header_shape(head)?;
    if let Some(descr) = object_descr(head) {
        return Err(NpyError::Object(descr));
    }
    let header = npyz::NpyHeader::from_reader(head)?;
    let file = NpyFile::with_header(header, &[][..]);
    if file.order() == Order::Fortran && file.shape().len() > 1 {
        return Err(NpyError::Fortran);
    }
    let npy_dtype = file.dtype();
    let NpyDType::Plain(ts) = &npy_dtype else {
        return Err(NpyError::Dtype(npy_dtype.descr()));
    };
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::RawData, 2) => DType::BF16,
        (TypeChar::Bool, 1) => DType::Bool,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Uint, 1) => DType::U8,
        _ => return Err(NpyError::Dtype(ts.to_string())),
    };
    let little = !matches!(ts.endianness(), npyz::Endianness::Big) || ts.size_field() == 1;
    if !little {
        return Err(NpyError::Dtype(ts.to_string()));
    }
    let n = file.shape().iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if n.and_then(|n| n.checked_mul(u64::from(dtype.bits().div_ceil(8)))) != Some(data_len) {
        return Err(NpyError::Truncated { shape: format!("{:?}", file.shape()), bytes: data_len });
    }
    Ok((dtype, file.shape().iter().map(|&d| d as usize).collect()))
}

/// A plain numpy header is one dict whose only tuple is the shape. npyz's header parser takes
/// exponential time on deeply nested brackets (found by `cargo fuzz run npy_reader`), so anything
/// else is refused before it is parsed.
fn check_header_shape(bytes: &[u8]) -> Result<(), NpyError> {
    let end = (bytes_before_data(bytes) as usize).min(bytes.len());
    let text = bytes.get(8..end).unwrap_or_default();
    let count = |c: u8| text.iter().filter(|&&b| b == c).count();
    if bytes.len() >= 10 && (count(b'{') > 1 || count(b'(') > 1 || count(b'[') > 0) {
        return Err(NpyError::Header);
    }
    Ok(())
}

/// The descr of an object array (`|O`, `O`, `<O8`, ...), which npyz does not parse.
fn object_descr(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head.get(10..)?);
    let after = text.split_once("'descr':")?.1.trim_start();
    let descr = after.strip_prefix('\'')?.split('\'').next()?;
    descr.trim_start_matches(['|', '<', '>', '=']).starts_with('O').then(|| descr.to_string())
}

/// Where the data of a `.npy` file starts: magic, version, header length (2 or 4 bytes), header.
fn bytes_before_data(bytes: &[u8]) -> u64 {
    let byte = |i: usize| bytes.get(i).copied().map(u64::from);
    match (bytes.get(6), byte(8), byte(9), byte(10), byte(11)) {
        (Some(1), Some(a), Some(b), _, _) => 10 + (a | b << 8),
        (Some(_), Some(a), Some(b), Some(c), Some(d)) => 12 + (a | b << 8 | c << 16 | d << 24),
        _ => bytes.len() as u64,
    }
}

/// Writes a host array as a `.npy` file (format 1.0, little-endian, C order) to `w`.
///
/// The header is written here and the elements in one piece: npyz serialises element by element
/// (about 6 ms per million elements), which made writing outputs the slowest part of a run. The
/// format is numpy's NEP 1; the tests read every file written here back with npyz.
pub fn write_to<W: Write>(mut w: W, a: &HostArray) -> std::io::Result<()> {
    let descr = match &a.data {
        ArrayData::F32(_) => "<f4",
        ArrayData::F16(_) => "<f2",
        ArrayData::BF16(_) => "|V2",
        ArrayData::I32(_) => "<i4",
        ArrayData::U32(_) => "<u4",
        ArrayData::Bool(_) => "|b1",
        ArrayData::I8(_) => "|i1",
        ArrayData::U8(_) => "|u1",
        ArrayData::I16(_) => "<i2",
        ArrayData::U16(_) => "<u2",
    };
    let shape = match a.shape.as_slice() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + newline: a multiple of 64 bytes.
    let pad = (64 - (10 + header.len() + 1) % 64) % 64;
    header.extend(std::iter::repeat_n(' ', pad));
    header.push('\n');
    let len = u16::try_from(header.len()).map_err(|_| std::io::Error::other("the .npy header is longer than 65535 bytes"))?;
    w.write_all(MAGIC)?;
    w.write_all(b"\x01\x00")?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(header.as_bytes())?;
    w.write_all(&a.le_bytes())?;
    w.flush()
}

/// Writes a host array to `path` whole ([`crate::staged`]): a temporary file in the same folder,
/// renamed into place when complete, so a failure never leaves a half-written `.npy`. A reader
/// sees the old file, then none for an instant, then the whole new one — never part of either.
/// Several outputs written together go through one [`crate::staged::Batch`].
pub fn write(path: &Path, a: &HostArray) -> std::io::Result<()> {
    crate::staged::write(path, |w| write_to(w, a)).map_err(|f| f.source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// A header that promises more (or less) data than follows is an error, before any allocation.
    #[test]
    fn lying_headers_are_errors() {
        let mut bytes = Vec::new();
        write_to(&mut bytes, &HostArray { shape: vec![4], data: ArrayData::F32(vec![1.0; 4]) }).unwrap();
        assert!(matches!(read_bytes(&bytes[..bytes.len() - 1]), Err(NpyError::Truncated { .. })));
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (4000000000000,), }\n";
        let mut huge = b"\x93NUMPY\x01\x00".to_vec();
        huge.extend((header.len() as u16).to_le_bytes());
        huge.extend(header.as_bytes());
        huge.extend([0u8; 16]);
        assert!(matches!(read_bytes(&huge), Err(NpyError::Truncated { .. }) | Err(NpyError::Io(_))));
        assert!(read_bytes(b"\x93NUMPY").is_err());
        // Nested brackets are refused before npyz parses them (it takes exponential time).
        let mut nested = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
        nested.extend(std::iter::repeat_n(b'{', 40));
        nested.extend(std::iter::repeat_n(b' ', 78));
        assert!(matches!(read_bytes(&nested), Err(NpyError::Header)));
        assert!(read_bytes(&[]).is_err());
        // The same refusals from a file, read header first.
        let dir = tempfile::tempdir().unwrap();
        for (n, b) in [&bytes[..bytes.len() - 1], &huge[..], &nested[..], &bytes[..5]].iter().enumerate() {
            let path = dir.path().join(format!("bad{n}.npy"));
            std::fs::write(&path, b).unwrap();
            assert!(read(&path).is_err(), "bad{n}");
        }
        // Big-endian data is refused, naming its dtype.
        let mut be = bytes.clone();
        let at = be.windows(3).position(|w| w == b"<f4").expect("the descr");
        be[at] = b'>';
        assert!(matches!(read_bytes(&be), Err(NpyError::Dtype(d)) if d == ">f4"));
        // An object array (np.save of dtype=object: a pickle follows) says so.
        let header = "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }\n";
        let mut object = b"\x93NUMPY\x01\x00".to_vec();
        object.extend((header.len() as u16).to_le_bytes());
        object.extend(header.as_bytes());
        object.extend(b"\x80\x04pickle");
        let e = read_bytes(&object).unwrap_err();
        assert!(matches!(&e, NpyError::Object(d) if d == "|O"), "{e}");
        assert!(e.to_string().starts_with("it holds Python objects (dtype `|O`), not numbers\n  save a numeric array"), "{e}");
        // Shorter than a header (found by cargo fuzz).
        for n in 0..12 {
            assert!(read_bytes(&bytes[..n]).is_err());
        }
    }

    /// Every dtype and rank written here reads back through npyz with its shape and values.
    #[test]
    fn npyz_reads_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let arrays = [
            HostArray { shape: vec![], data: ArrayData::F32(vec![2.5]) },
            HostArray { shape: vec![3], data: ArrayData::I32(vec![-1, 0, 7]) },
            HostArray { shape: vec![2, 3], data: ArrayData::U32(vec![1, 2, 3, 4, 5, 6]) },
            HostArray { shape: vec![2, 1, 2], data: ArrayData::Bool(vec![true, false, false, true]) },
            HostArray { shape: vec![2], data: ArrayData::F16(vec![f16::from_f32(0.5), f16::from_f32(-3.0)]) },
            HostArray { shape: vec![2], data: ArrayData::BF16(vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]) },
            HostArray { shape: vec![1000, 17], data: ArrayData::F32((0..17000).map(|i| i as f32 * 0.5).collect()) },
        ];
        for (n, a) in arrays.iter().enumerate() {
            let path = dir.path().join(format!("a{n}.npy"));
            write(&path, a).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0, "the data starts 64-aligned");
            let file = NpyFile::new(&bytes[..]).unwrap();
            assert_eq!(file.shape().iter().map(|&d| d as usize).collect::<Vec<_>>(), a.shape);
            assert_eq!(&read(&path).unwrap(), a);
        }
    }
}
