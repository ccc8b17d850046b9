//! Element-wise reductions for the cross-process all-reduce: sum, product, max and min over
//! the integer and floating types NCCL and HCCL name (fp16 and bf16 computed in f32 and
//! rounded to nearest even, as the devices' reductions do per step). Integers wrap.

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    Bf16,
    F32,
    F64,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::I8 | Elem::U8 => 1,
            Elem::I16 | Elem::U16 | Elem::F16 | Elem::Bf16 => 2,
            Elem::I32 | Elem::U32 | Elem::F32 => 4,
            Elem::I64 | Elem::U64 | Elem::F64 => 8,
        }
    }

    /// `ncclDataType_t` (NCCL 2.20).
    pub fn from_nccl(t: i32) -> Option<Elem> {
        Some(match t {
            0 => Elem::I8,
            1 => Elem::U8,
            2 => Elem::I32,
            3 => Elem::U32,
            4 => Elem::I64,
            5 => Elem::U64,
            6 => Elem::F16,
            7 => Elem::F32,
            8 => Elem::F64,
            9 => Elem::Bf16,
            _ => return None,
        })
    }

    /// `HcclDataType` (`hccl_types.h`; INT128 has no reduction here).
    pub fn from_hccl(t: i32) -> Option<Elem> {
        Some(match t {
            0 => Elem::I8,
            1 => Elem::I16,
            2 => Elem::I32,
            3 => Elem::F16,
            4 => Elem::F32,
            5 => Elem::I64,
            6 => Elem::U64,
            7 => Elem::U8,
            8 => Elem::U16,
            9 => Elem::U32,
            10 => Elem::F64,
            11 => Elem::Bf16,
            _ => return None,
        })
    }
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
}

impl RedOp {
    /// `ncclRedOp_t`: 0 sum, 1 prod, 2 max, 3 min (`ncclAvg` 4 is not supported).
    pub fn from_nccl(op: i32) -> Option<RedOp> {
        Some(match op {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            _ => return None,
        })
    }

    /// `HcclReduceOp`: 0 sum, 1 prod, 2 max, 3 min.
    pub fn from_hccl(op: i32) -> Option<RedOp> {
        RedOp::from_nccl(op)
    }

    fn float(self, a: f64, b: f64) -> f64 {
        match self {
            RedOp::Sum => a + b,
            RedOp::Prod => a * b,
            RedOp::Max => a.max(b),
            RedOp::Min => a.min(b),
        }
    }
}

/// IEEE half -> f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut f = f;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// f32 -> IEEE half, rounding to nearest even.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let frac = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if frac != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    let (mant, shift) = if e <= 0 {
        if e < -10 {
            return sign;
        }
        (frac | 0x80_0000, (14 - e) as u32)
    } else {
        (frac, 13)
    };
    let mut half = mant >> shift;
    let rest = mant & ((1 << shift) - 1);
    let halfway = 1 << (shift - 1);
    if rest > halfway || (rest == halfway && half & 1 == 1) {
        half += 1;
    }
    let out = if e <= 0 {
        half
    } else {
        ((e as u32) << 10) + half
    };
    sign | out as u16
}

/// bf16 -> f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 -> bf16, rounding to nearest even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// `dst[i] = f(dst[i], src[i])` over `T`s, when both byte slices are aligned for `T` (device
/// memory is page-aligned, chunk offsets are whole elements): a plain loop, fast even in debug
/// builds. `false` when they are not (the caller takes the byte-wise path).
fn aligned<T: Copy>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) -> bool {
    // SAFETY: every bit pattern is a valid `T` for the integer and float types used here;
    // align_to only reinterprets the aligned middle part.
    let (dpre, d, dpost) = unsafe { dst.align_to_mut::<T>() };
    // SAFETY: as above.
    let (spre, s, spost) = unsafe { src.align_to::<T>() };
    if !dpre.is_empty() || !spre.is_empty() || dpost.len() != spost.len() {
        return false;
    }
    for (d, s) in d.iter_mut().zip(s) {
        *d = f(*d, *s);
    }
    true
}

macro_rules! fast {
    ($dst:ident, $src:ident, $op:ident, $t:ty, int) => {
        match $op {
            RedOp::Sum => aligned::<$t>($dst, $src, |a, b| a.wrapping_add(b)),
            RedOp::Prod => aligned::<$t>($dst, $src, |a, b| a.wrapping_mul(b)),
            RedOp::Max => aligned::<$t>($dst, $src, |a, b| a.max(b)),
            RedOp::Min => aligned::<$t>($dst, $src, |a, b| a.min(b)),
        }
    };
    ($dst:ident, $src:ident, $op:ident, $t:ty, float) => {
        match $op {
            RedOp::Sum => aligned::<$t>($dst, $src, |a, b| a + b),
            RedOp::Prod => aligned::<$t>($dst, $src, |a, b| a * b),
            RedOp::Max => aligned::<$t>($dst, $src, |a, b| a.max(b)),
            RedOp::Min => aligned::<$t>($dst, $src, |a, b| a.min(b)),
        }
    };
}

/// A 16-bit float format's decoding and encoding.
type HalfConversions = (fn(u16) -> f32, fn(f32) -> u16);

macro_rules! ints {
    ($dst:ident, $src:ident, $op:ident, $t:ty) => {{
        const N: usize = std::mem::size_of::<$t>();
        for (d, s) in $dst.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
            let a = <$t>::from_le_bytes(d.try_into().unwrap_or_default());
            let b = <$t>::from_le_bytes(s.try_into().unwrap_or_default());
            let r = match $op {
                RedOp::Sum => a.wrapping_add(b),
                RedOp::Prod => a.wrapping_mul(b),
                RedOp::Max => a.max(b),
                RedOp::Min => a.min(b),
            };
            d.copy_from_slice(&r.to_le_bytes());
        }
    }};
}

/// `dst[i] = op(dst[i], src[i])` element by element (little-endian, as the hosts here).
/// Trailing bytes short of an element are left alone.
pub fn reduce_into(dst: &mut [u8], src: &[u8], elem: Elem, op: RedOp) {
    let n = dst.len().min(src.len()) / elem.size() * elem.size();
    let (dst, src) = (&mut dst[..n], &src[..n]);
    let done = match elem {
        Elem::I8 => fast!(dst, src, op, i8, int),
        Elem::U8 => fast!(dst, src, op, u8, int),
        Elem::I16 => fast!(dst, src, op, i16, int),
        Elem::U16 => fast!(dst, src, op, u16, int),
        Elem::I32 => fast!(dst, src, op, i32, int),
        Elem::U32 => fast!(dst, src, op, u32, int),
        Elem::I64 => fast!(dst, src, op, i64, int),
        Elem::U64 => fast!(dst, src, op, u64, int),
        Elem::F32 => fast!(dst, src, op, f32, float),
        Elem::F64 => fast!(dst, src, op, f64, float),
        Elem::F16 | Elem::Bf16 => false,
    };
    if done {
        return;
    }
    match elem {
        Elem::I8 => ints!(dst, src, op, i8),
        Elem::U8 => ints!(dst, src, op, u8),
        Elem::I16 => ints!(dst, src, op, i16),
        Elem::U16 => ints!(dst, src, op, u16),
        Elem::I32 => ints!(dst, src, op, i32),
        Elem::U32 => ints!(dst, src, op, u32),
        Elem::I64 => ints!(dst, src, op, i64),
        Elem::U64 => ints!(dst, src, op, u64),
        Elem::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let a = f32::from_le_bytes(d.try_into().unwrap_or_default());
                let b = f32::from_le_bytes(s.try_into().unwrap_or_default());
                let r = op.float(f64::from(a), f64::from(b)) as f32;
                d.copy_from_slice(&r.to_le_bytes());
            }
        }
        Elem::F64 => {
            for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let a = f64::from_le_bytes(d.try_into().unwrap_or_default());
                let b = f64::from_le_bytes(s.try_into().unwrap_or_default());
                d.copy_from_slice(&op.float(a, b).to_le_bytes());
            }
        }
        Elem::F16 | Elem::Bf16 => {
            let (to, from): HalfConversions = if elem == Elem::F16 {
                (f16_to_f32, f32_to_f16)
            } else {
                (bf16_to_f32, f32_to_bf16)
            };
            for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
                let a = to(u16::from_le_bytes([d[0], d[1]]));
                let b = to(u16::from_le_bytes([s[0], s[1]]));
                let r = from(op.float(f64::from(a), f64::from(b)) as f32);
                d.copy_from_slice(&r.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip_and_round_to_even() {
        for h in [
            0x0000u16, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0x3555,
        ] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#06x}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even (1.0) wins.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(70000.0), 0x7c00, "overflow is infinity");
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(f32_to_bf16(3.0)), 3.0);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80, "halfway: even");
    }

    #[test]
    fn sums_of_every_type_chd_uses() {
        let mut d: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let s: Vec<u8> = [2.25f32, 0.5]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        reduce_into(&mut d, &s, Elem::F32, RedOp::Sum);
        assert_eq!(
            d,
            [3.75f32, -1.5]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<_>>()
        );

        let mut d = f32_to_f16(1.5).to_le_bytes().to_vec();
        reduce_into(
            &mut d,
            &f32_to_f16(2.0).to_le_bytes(),
            Elem::F16,
            RedOp::Sum,
        );
        assert_eq!(f16_to_f32(u16::from_le_bytes([d[0], d[1]])), 3.5);

        let mut d = f32_to_bf16(-4.0).to_le_bytes().to_vec();
        reduce_into(
            &mut d,
            &f32_to_bf16(1.0).to_le_bytes(),
            Elem::Bf16,
            RedOp::Sum,
        );
        assert_eq!(bf16_to_f32(u16::from_le_bytes([d[0], d[1]])), -3.0);

        let mut d = vec![100u8, 0xff];
        reduce_into(&mut d, &[100, 0x01], Elem::I8, RedOp::Sum);
        assert_eq!(d, [200, 0], "int8 wraps: 100 + 100 = -56, -1 + 1 = 0");

        let mut d = vec![3u8, 9];
        reduce_into(&mut d, &[5, 2], Elem::U8, RedOp::Max);
        assert_eq!(d, [5, 9]);
    }

    #[test]
    fn unaligned_buffers_take_the_byte_path_with_the_same_result() {
        let a: Vec<u8> = (0..4 * 9 + 1).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..4 * 9 + 1).map(|i| (i * 7) as u8).collect();
        let mut want = a[..36].to_vec();
        reduce_into(&mut want, &b[..36], Elem::I32, RedOp::Sum);
        for off in 1..4 {
            let (mut d, mut s) = (vec![0u8; 40], vec![0u8; 40]);
            d[off..off + 36].copy_from_slice(&a[..36]);
            s[off..off + 36].copy_from_slice(&b[..36]);
            reduce_into(
                &mut d[off..off + 36],
                &s[off..off + 36],
                Elem::I32,
                RedOp::Sum,
            );
            assert_eq!(&d[off..off + 36], &want[..], "offset {off}");
        }
    }
}
