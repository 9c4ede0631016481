//! The yardstick for the Mosaic GPU backend's matmuls: cuBLAS on the same device, `sgemm` (f32)
//! and `gemmEx` (bf16 operands, f32 compute) at N x N x N, each timed with CUDA events over
//! device-resident arrays (the median of 20 runs after 3 untimed ones). One JSON object a line,
//! for scripts/gpu-check to set beside `tessel bench --backend mosaic-gpu --json`.
//!
//!   cargo build --release -p tessel-mosaic-gpu --example cublas
//!   target/release/examples/cublas [N]        # N = 4096 by default

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(4096);
    // The backend's own check first: cudarc panics where no driver library exists.
    if let Err(why) = tessel_mosaic_gpu::runtime::gpu() {
        eprintln!("error: no GPU for cuBLAS: {why}");
        std::process::exit(1);
    }
    if let Err(e) = run(n) {
        eprintln!("error: cuBLAS: {e}");
        std::process::exit(1);
    }
}

fn run(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(stream.clone())?;
    fn cfg<T>(n: usize, one: T, zero: T) -> GemmConfig<T> {
        GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: n as i32,
            k: n as i32,
            alpha: one,
            lda: n as i32,
            ldb: n as i32,
            beta: zero,
            ldc: n as i32,
        }
    }
    let ms = time::<f32>(
        &stream,
        n,
        |x| x,
        |a, b, c| {
            // SAFETY: a, b and c are n x n arrays on this stream, as the configuration says.
            #[allow(unsafe_code, reason = "cuBLAS")]
            unsafe {
                blas.gemm(cfg(n, 1.0, 0.0), a, b, c)
            }
        },
    )?;
    report("sgemm", n, ms);
    let ms = time::<half::bf16>(&stream, n, half::bf16::from_f32, |a, b, c| {
        // SAFETY: as above.
        #[allow(unsafe_code, reason = "cuBLAS")]
        unsafe {
            blas.gemm(cfg(n, half::bf16::ONE, half::bf16::ZERO), a, b, c)
        }
    })?;
    report("gemmEx bf16", n, ms);
    Ok(())
}

fn report(op: &str, n: usize, ms: f64) {
    let gflops = 2.0 * (n as f64).powi(3) / ms / 1e6;
    println!("{{\"library\": \"cublas\", \"op\": \"{op}\", \"n\": {n}, \"ms\": {ms:.4}, \"gflops\": {gflops:.1}}}");
}

/// The median milliseconds of `gemm` on n x n operands of small values.
fn time<T: DeviceRepr + ValidAsZeroBits + Copy>(
    stream: &Arc<CudaStream>,
    n: usize,
    from: impl Fn(f32) -> T,
    gemm: impl Fn(&CudaSlice<T>, &CudaSlice<T>, &mut CudaSlice<T>) -> Result<(), cudarc::cublas::result::CublasError>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let host: Vec<T> = (0..n * n).map(|i| from(((i % 17) as f32 - 8.0) / 64.0)).collect();
    let (a, b) = (stream.clone_htod(&host)?, stream.clone_htod(&host)?);
    let mut c = stream.alloc_zeros::<T>(n * n)?;
    for _ in 0..3 {
        gemm(&a, &b, &mut c)?;
    }
    let mut times = Vec::new();
    for _ in 0..20 {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        gemm(&a, &b, &mut c)?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        times.push(f64::from(start.elapsed_ms(&end)?));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
