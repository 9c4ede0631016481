//! The bytes of a state space: global memory and a CTA's dynamic shared memory, with bounds and
//! alignment checked on every access.

/// The bytes of one state space: global memory (one growing array, addresses from 4096) or a
/// CTA's dynamic shared memory (addresses from 0).
pub struct Memory {
    bytes: Vec<u8>,
    base: u64,
    space: &'static str,
}

impl Default for Memory {
    fn default() -> Memory {
        Memory { bytes: Vec::new(), base: 4096, space: "global" }
    }
}

/// Shared memory starts as this word (a NaN), not as zeros.
const POISON: u32 = 0x7FBA_DBAD;

impl Memory {
    /// A CTA's dynamic shared memory of `len` bytes, filled with [`POISON`].
    pub(crate) fn shared(len: usize) -> Memory {
        let mut bytes = POISON.to_le_bytes().repeat(len.div_ceil(4));
        bytes.truncate(len);
        Memory { bytes, base: 0, space: "dynamic shared" }
    }

    /// Allocates `len` zeroed bytes (16-aligned) and returns the address.
    pub fn alloc(&mut self, len: usize) -> u64 {
        let at = self.bytes.len().div_ceil(16) * 16;
        self.bytes.resize(at + len.max(16), 0);
        self.base + at as u64
    }

    /// Writes 32-bit words at `addr`.
    pub fn write_words(&mut self, addr: u64, words: &[u32]) {
        for (i, w) in words.iter().enumerate() {
            self.store(addr + 4 * i as u64, *w).expect("in bounds");
        }
    }

    /// Reads `n` 32-bit words at `addr`.
    pub fn read_words(&self, addr: u64, n: usize) -> Vec<u32> {
        (0..n).map(|i| self.load(addr + 4 * i as u64).expect("in bounds")).collect()
    }

    /// Writes elements of `width` bytes (1, 2 or 4) at `addr`: the low bytes of each of `bits`.
    pub fn write_elements(&mut self, addr: u64, width: usize, bits: &[u32]) {
        for (i, b) in bits.iter().enumerate() {
            self.store_n(addr + (width * i) as u64, width, *b).expect("in bounds");
        }
    }

    /// Reads `n` elements of `width` bytes (1, 2 or 4) at `addr`, each zero-extended.
    pub fn read_elements(&self, addr: u64, width: usize, n: usize) -> Vec<u32> {
        (0..n).map(|i| self.load_n(addr + (width * i) as u64, width).expect("in bounds")).collect()
    }

    /// Writes 16-bit halves at `addr`.
    pub fn write_halves(&mut self, addr: u64, halves: &[u16]) {
        for (i, h) in halves.iter().enumerate() {
            self.store_n(addr + 2 * i as u64, 2, u32::from(*h)).expect("in bounds");
        }
    }

    /// Reads `n` 16-bit halves at `addr`.
    pub fn read_halves(&self, addr: u64, n: usize) -> Vec<u16> {
        (0..n).map(|i| self.load_n(addr + 2 * i as u64, 2).expect("in bounds") as u16).collect()
    }

    fn index(&self, addr: u64, size: usize) -> Result<usize, String> {
        let space = self.space;
        let i = addr.checked_sub(self.base).ok_or(format!("{space} access below its memory at {addr:#x}"))?;
        let i = usize::try_from(i).map_err(|_| format!("{space} access at {addr:#x}"))?;
        if i + size > self.bytes.len() {
            return Err(format!("{space} access at {addr:#x}, past the {} bytes of {space} memory", self.bytes.len()));
        }
        if !i.is_multiple_of(size) {
            return Err(format!("misaligned {space} access at {addr:#x}"));
        }
        Ok(i)
    }

    pub(crate) fn load(&self, addr: u64) -> Result<u32, String> {
        self.load_n(addr, 4)
    }

    pub(crate) fn store(&mut self, addr: u64, v: u32) -> Result<(), String> {
        self.store_n(addr, 4, v)
    }

    /// `size` (1, 2 or 4) little-endian bytes at `addr`.
    pub(crate) fn load_n(&self, addr: u64, size: usize) -> Result<u32, String> {
        let i = self.index(addr, size)?;
        Ok(self.bytes[i..i + size].iter().rev().fold(0, |acc, b| (acc << 8) | u32::from(*b)))
    }

    pub(crate) fn store_n(&mut self, addr: u64, size: usize, v: u32) -> Result<(), String> {
        let i = self.index(addr, size)?;
        self.bytes[i..i + size].copy_from_slice(&v.to_le_bytes()[..size]);
        Ok(())
    }
}
