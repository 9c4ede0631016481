//! Reading and writing numpy `.npy` files (v1, little-endian, C order) with `npyz`.
//!
//! Dtypes: `<f4` f32, `<f2` f16, `<i4` i32, `<u4` u32, `|b1` bool, and `|V2` for bf16 (what
//! `np.save` writes for an `ml_dtypes.bfloat16` array: two raw bytes per element).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use half::{bf16, f16};
use npyz::{DType as NpyDType, FixedSizeBytes, NpyFile, Order, TypeChar, WriterBuilder};
use tessel_plugin_api::array::{ArrayData, HostArray};

/// What went wrong with one `.npy` file; the host adds the path.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file could not be opened or read.
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    /// A dtype tessel does not take.
    #[error(
        "its dtype is `{0}`, which tessel does not take\n  expected f32 (<f4), f16 (<f2), bf16 (|V2), i32 (<i4), u32 (<u4) or bool (|b1); convert with e.g. `x.astype(np.float32)`"
    )]
    Dtype(String),
    /// Fortran order.
    #[error("it is in Fortran order\n  expected C order; save `np.ascontiguousarray(x)`")]
    Fortran,
}

fn read_vec<T: npyz::Deserialize>(file: NpyFile<BufReader<File>>) -> Result<Vec<T>, NpyError> {
    Ok(file.into_vec::<T>()?)
}

/// Reads a `.npy` file into a host array.
pub fn read(path: &Path) -> Result<HostArray, NpyError> {
    let file = NpyFile::new(BufReader::new(File::open(path)?))?;
    if file.order() == Order::Fortran && file.shape().len() > 1 {
        return Err(NpyError::Fortran);
    }
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    let dtype = file.dtype();
    let NpyDType::Plain(ts) = &dtype else {
        return Err(NpyError::Dtype(dtype.descr()));
    };
    let data = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 4) => ArrayData::F32(read_vec(file)?),
        (TypeChar::Float, 2) => ArrayData::F16(read_vec::<f16>(file)?),
        (TypeChar::Int, 4) => ArrayData::I32(read_vec(file)?),
        (TypeChar::Uint, 4) => ArrayData::U32(read_vec(file)?),
        (TypeChar::Bool, 1) => ArrayData::Bool(read_vec(file)?),
        (TypeChar::RawData, 2) => {
            ArrayData::BF16(read_vec::<FixedSizeBytes<2>>(file)?.into_iter().map(|b| bf16::from_le_bytes(b.0)).collect())
        }
        _ => return Err(NpyError::Dtype(ts.to_string())),
    };
    let array = HostArray { shape, data };
    Ok(array)
}

fn write_all<T: npyz::AutoSerialize, W: Write>(w: W, shape: &[u64], items: impl IntoIterator<Item = T>) -> std::io::Result<()> {
    let mut out = npyz::WriteOptions::new().default_dtype().shape(shape).writer(w).begin_nd()?;
    out.extend(items)?;
    out.finish()
}

/// Writes a host array as a `.npy` file to `w`.
pub fn write_to<W: Write>(w: W, a: &HostArray) -> std::io::Result<()> {
    let shape: Vec<u64> = a.shape.iter().map(|&d| d as u64).collect();
    match &a.data {
        ArrayData::F32(v) => write_all(w, &shape, v.iter().copied()),
        ArrayData::F16(v) => write_all(w, &shape, v.iter().copied()),
        ArrayData::I32(v) => write_all(w, &shape, v.iter().copied()),
        ArrayData::U32(v) => write_all(w, &shape, v.iter().copied()),
        ArrayData::Bool(v) => write_all(w, &shape, v.iter().copied()),
        ArrayData::BF16(v) => {
            let dtype = NpyDType::Plain("|V2".parse().expect("|V2 is a valid type string"));
            let mut out = npyz::WriteOptions::new().dtype(dtype).shape(&shape).writer(w).begin_nd()?;
            out.extend(v.iter().map(|x| FixedSizeBytes(x.to_le_bytes())))?;
            out.finish()
        }
    }
}

/// Writes a host array to `path` atomically: a temporary file in the same folder, renamed into
/// place when complete, so a failure never leaves a half-written `.npy`.
pub fn write(path: &Path, a: &HostArray) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    write_to(BufWriter::new(tmp.as_file_mut()), a)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
