//! The AVX2 + FMA bodies of the flash-attention steps (key conversion and transposition, score
//! tiles, online softmax, value tiles), each bit-identical to the scalar body in the parent module.
// Register-tile loops index the tile's accumulators and its inputs by the same row or head.
#![allow(clippy::needless_range_loop)]

use super::*;
use std::arch::x86_64::*;

#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn convert_row<E: KvElem>(src: &[E], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), E::load8(src.as_ptr().add(i)));
        i += 8;
    }
}

/// [`super::sum_exp_shifted`] on AVX2: one 8-lane accumulator per block, NaN lanes masked
/// to 0, the tail of a block through the same lanes with the missing ones masked.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sum_exp_shifted(x: &[f32], m: f32) -> f64 {
    let mv = _mm256_set1_ps(m);
    let mut total = 0f64;
    for block in x.chunks(super::SUM_EXP_BLOCK) {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= block.len() {
            let d = _mm256_sub_ps(_mm256_loadu_ps(block.as_ptr().add(i)), mv);
            let ord = _mm256_cmp_ps::<_CMP_ORD_Q>(d, d);
            acc = _mm256_add_ps(acc, _mm256_and_ps(ord, exp8(d)));
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        for (l, &v) in block[i..].iter().enumerate() {
            let d = v - m;
            lanes[l] += if d.is_nan() { 0.0 } else { super::exp_f32(d) };
        }
        for l in lanes {
            total += l as f64;
        }
    }
    total
}

/// `e^x` lane by lane, the operations of [`exp_f32`].
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    let lo = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
    // `minps` returns its second operand when either is NaN: NaN stays NaN, as in `exp_f32`.
    let x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    let out = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    _mm256_andnot_ps(lo, out)
}

/// Converts the block's keys (`kslots`, at most [`KEY_BLOCK`]) to f32 and writes them
/// transposed, `kt[d·KEY_BLOCK + j] = k_j[d]`, 8 × 8 at a time; the columns up to the next
/// multiple of 16 are zero.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn transpose_keys<E: KvElem>(kv: &KvView<'_, E>, kslots: &[u32], hd: usize, kt: &mut [f32]) {
    let nk = kslots.len();
    assert!(nk <= KEY_BLOCK && kt.len() >= hd * KEY_BLOCK && hd.is_multiple_of(8));
    let kp = kv.k.as_ptr();
    let ktp = kt.as_mut_ptr();
    for j0 in (0..nk).step_by(8) {
        let base: [Option<usize>; 8] =
            std::array::from_fn(|i| kslots.get(j0 + i).map(|&s| s as usize * kv.stride + kv.off));
        for d0 in (0..hd).step_by(8) {
            let r: [__m256; 8] =
                std::array::from_fn(|i| base[i].map_or(_mm256_setzero_ps(), |b| E::load8(kp.add(b + d0))));
            let cols = crate::kernels::transpose8(&r);
            for (i, c) in cols.iter().enumerate() {
                _mm256_storeu_ps(ktp.add((d0 + i) * KEY_BLOCK + j0), *c);
            }
        }
    }
    let (n8, n16) = (nk.next_multiple_of(8), nk.next_multiple_of(16));
    if n16 > n8 {
        for d in 0..hd {
            _mm256_storeu_ps(ktp.add(d * KEY_BLOCK + n8), _mm256_setzero_ps());
        }
    }
}

/// [`super::block_scores`] for `rows ≤ 8`: `qt[d]` holds the rows' `q_r[d]` in lanes, each
/// key's `k_j[d]` is broadcast, 4 keys at a time (4 chains in flight per 8 rows).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn few_rows_scores<E: KvElem>(
    q: &[f32],
    p: &Parts,
    kv: &KvView<'_, E>,
    kslots: &[u32],
    qt: &mut Vec<f32>,
    s: &mut [f32],
) {
    let hd = p.hd;
    assert!(p.rows <= 8 && q.len() >= p.rows * hd && s.len() >= p.rows * KEY_BLOCK);
    qt.clear();
    qt.resize(hd * 8, 0.0);
    let zero = _mm256_setzero_ps();
    for d0 in (0..hd).step_by(8) {
        let r: [__m256; 8] =
            std::array::from_fn(|i| if i < p.rows { _mm256_loadu_ps(q.as_ptr().add(i * hd + d0)) } else { zero });
        for (i, v) in crate::kernels::transpose8(&r).iter().enumerate() {
            _mm256_storeu_ps(qt.as_mut_ptr().add((d0 + i) * 8), *v);
        }
    }
    let sc = _mm256_set1_ps(p.scale);
    let kp = kv.k.as_ptr();
    let n = kslots.len();
    for j0 in (0..n).step_by(4) {
        let base: [usize; 4] = std::array::from_fn(|i| kslots[(j0 + i).min(n - 1)] as usize * kv.stride + kv.off);
        let mut a = [zero; 4];
        for d in 0..hd {
            let qv = _mm256_loadu_ps(qt.as_ptr().add(d * 8));
            for (i, ai) in a.iter_mut().enumerate() {
                let kd = _mm256_set1_ps((*kp.add(base[i] + d)).to_f32());
                *ai = _mm256_fmadd_ps(kd, qv, *ai);
            }
        }
        for (i, ai) in a.iter().enumerate().take(n - j0) {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_mul_ps(*ai, sc));
            for (r, &l) in lanes.iter().enumerate().take(p.rows) {
                s[r * KEY_BLOCK + j0 + i] = l;
            }
        }
    }
}

/// Rows of the next tile when `left` rows remain: as many tiles as [`TILE_ROWS`] needs, of
/// sizes that differ by at most one (one token's 8 GQA rows as 4 + 4, not 6 + 2, whose
/// 2-row tile loads as much per FMA as a 6-row one does for three times the work).
#[inline]
fn tile_rows(left: usize) -> usize {
    left.div_ceil(left.div_ceil(TILE_ROWS))
}

/// Scores of `RT ≤ TILE_ROWS` rows (from `r0`) against the 16 keys from `j`: one FMA chain over
/// `d` per score, 2·RT chains in flight.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn score_tile<const RT: usize>(q: *const f32, p: &Parts, r0: usize, kt: *const f32, j: usize, s: *mut f32) {
    let mut acc = [[_mm256_setzero_ps(); 2]; RT];
    for d in 0..p.hd {
        let kp = kt.add(d * KEY_BLOCK + j);
        let (a, b) = (_mm256_loadu_ps(kp), _mm256_loadu_ps(kp.add(8)));
        for r in 0..RT {
            let qv = _mm256_broadcast_ss(&*q.add((r0 + r) * p.hd + d));
            acc[r][0] = _mm256_fmadd_ps(a, qv, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(b, qv, acc[r][1]);
        }
    }
    let sc = _mm256_set1_ps(p.scale);
    for r in 0..RT {
        let sp = s.add((r0 + r) * KEY_BLOCK + j);
        _mm256_storeu_ps(sp, _mm256_mul_ps(acc[r][0], sc));
        _mm256_storeu_ps(sp.add(8), _mm256_mul_ps(acc[r][1], sc));
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores(q: &[f32], p: &Parts, kt: &[f32], s: &mut [f32]) {
    assert!(q.len() >= p.rows * p.hd && s.len() >= p.rows * KEY_BLOCK && kt.len() >= p.hd * KEY_BLOCK);
    let (qp, kp, sp) = (q.as_ptr(), kt.as_ptr(), s.as_mut_ptr());
    for j in (0..p.nk).step_by(16) {
        let mut r0 = 0;
        while r0 < p.rows {
            let rt = tile_rows(p.rows - r0);
            match rt {
                6 => score_tile::<6>(qp, p, r0, kp, j, sp),
                5 => score_tile::<5>(qp, p, r0, kp, j, sp),
                4 => score_tile::<4>(qp, p, r0, kp, j, sp),
                3 => score_tile::<3>(qp, p, r0, kp, j, sp),
                2 => score_tile::<2>(qp, p, r0, kp, j, sp),
                _ => score_tile::<1>(qp, p, r0, kp, j, sp),
            }
            r0 += rt;
        }
    }
}

/// The online-softmax update of each row: keys in lanes, 8 at a time.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax(p: &Parts, s: &mut [f32], m: &mut [f32], l: &mut [f32], alpha: &mut [f32], valid: &[i32]) {
    assert!(s.len() >= p.rows * KEY_BLOCK && m.len() >= p.rows && l.len() >= p.rows && valid.len() >= p.rows);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let n8 = p.nk.next_multiple_of(8);
    for r in 0..p.rows {
        let row = s.as_mut_ptr().add(r * KEY_BLOCK);
        let nv = _mm256_set1_epi32(valid[r]);
        let keep =
            |j: usize| _mm256_castsi256_ps(_mm256_cmpgt_epi32(nv, _mm256_add_epi32(lane, _mm256_set1_epi32(j as i32))));
        // Rows that see every key of a whole block (all but the diagonal) need no masks.
        let full = valid[r] as usize == n8;
        let mut mx = ninf;
        if full {
            for j in (0..n8).step_by(8) {
                mx = _mm256_max_ps(mx, _mm256_loadu_ps(row.add(j)));
            }
        } else {
            for j in (0..n8).step_by(8) {
                mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_loadu_ps(row.add(j)), keep(j)));
            }
        }
        let mx = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
        let mx = _mm_max_ps(mx, _mm_movehl_ps(mx, mx));
        let mx = _mm_cvtss_f32(_mm_max_ss(mx, _mm_shuffle_ps::<1>(mx, mx)));
        let m_new = m[r].max(mx);
        let a = if m_new == f32::NEG_INFINITY { 1.0 } else { exp_f32(m[r] - m_new) };
        let mv = _mm256_set1_ps(m_new);
        let mut sum = _mm256_setzero_ps();
        if full {
            for j in (0..n8).step_by(8) {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row.add(j)), mv));
                _mm256_storeu_ps(row.add(j), e);
                sum = _mm256_add_ps(sum, e);
            }
        } else {
            for j in (0..n8).step_by(8) {
                // Masked lanes may be −∞ − (−∞) = NaN before the mask; `and` clears them.
                let e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(row.add(j)), mv)), keep(j));
                _mm256_storeu_ps(row.add(j), e);
                sum = _mm256_add_ps(sum, e);
            }
        }
        l[r] = l[r].mul_add(a, crate::kernels::hsum(sum));
        m[r] = m_new;
        alpha[r] = a;
    }
}

/// `O = O·α + Σ_j p_j v_j` for `RT ≤ TILE_ROWS` rows × 16 dims.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn value_tile<T: KvElem, const RT: usize>(
    p: &Parts,
    r0: usize,
    d: usize,
    jmax: usize,
    v: *const T,
    koff: &[usize],
    s: *const f32,
    o: *mut f32,
    alpha: &[f32],
    valid: &[i32],
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; RT];
    for r in 0..RT {
        let a = _mm256_set1_ps(alpha[r0 + r]);
        let op = o.add((r0 + r) * p.hd + d);
        acc[r] = [_mm256_mul_ps(_mm256_loadu_ps(op), a), _mm256_mul_ps(_mm256_loadu_ps(op.add(8)), a)];
    }
    // Keys every row of the tile sees, then the diagonal's tail row by row: a row never
    // touches a value past its own position (0 · inf would be NaN).
    let jlo = valid[r0..r0 + RT].iter().copied().min().unwrap_or(0).max(0) as usize;
    for (j, &off) in koff[..jlo].iter().enumerate() {
        let vp = v.add(off + d);
        let (v0, v1) = (T::load8(vp), T::load8(vp.add(8)));
        for r in 0..RT {
            let w = _mm256_broadcast_ss(&*s.add((r0 + r) * KEY_BLOCK + j));
            acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
        }
    }
    for (j, &off) in koff[..jmax].iter().enumerate().skip(jlo) {
        let vp = v.add(off + d);
        let (v0, v1) = (T::load8(vp), T::load8(vp.add(8)));
        for r in 0..RT {
            if (j as i32) < valid[r0 + r] {
                let w = _mm256_broadcast_ss(&*s.add((r0 + r) * KEY_BLOCK + j));
                acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
            }
        }
    }
    for r in 0..RT {
        let op = o.add((r0 + r) * p.hd + d);
        _mm256_storeu_ps(op, acc[r][0]);
        _mm256_storeu_ps(op.add(8), acc[r][1]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn values<T: KvElem>(
    p: &Parts,
    v: &[T],
    koff: &[usize],
    s: &[f32],
    o: &mut [f32],
    alpha: &[f32],
    valid: &[i32],
) {
    assert!(o.len() >= p.rows * p.hd && s.len() >= p.rows * KEY_BLOCK && alpha.len() >= p.rows);
    let (vp, sp, op) = (v.as_ptr(), s.as_ptr(), o.as_mut_ptr());
    let mut r0 = 0;
    while r0 < p.rows {
        let rt = tile_rows(p.rows - r0);
        let jmax = valid[r0..r0 + rt].iter().copied().max().unwrap_or(0) as usize;
        for d in (0..p.hd).step_by(16) {
            match rt {
                6 => value_tile::<T, 6>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
                5 => value_tile::<T, 5>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
                4 => value_tile::<T, 4>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
                3 => value_tile::<T, 3>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
                2 => value_tile::<T, 2>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
                _ => value_tile::<T, 1>(p, r0, d, jmax, vp, koff, sp, op, alpha, valid),
            }
        }
        r0 += rt;
    }
}
