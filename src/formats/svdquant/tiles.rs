//! Nunchaku's tensor-core tile order (`runtime_tensor_layout:
//! nunchaku_packed`, 4-bit, warp_n 128), back to row-major.
//!
//! Each function gives the position in the stored (flattened) tensor of one
//! logical element; the formulas invert Nunchaku's packer (the layouts:
//! docs/formats.md#svdquant), one function per rule so each can be tested
//! alone. Tiles are 128 rows wide (`t = n div 128`).

/// Stored int32 word and nibble of weight code (n, k) of a `[N, K]` weight.
pub fn qweight(n: usize, k: usize, cols: usize) -> (usize, u32) {
    let t = n / 128;
    let word = ((((((t * (cols / 64) + k / 64) * 8 + (n % 128) / 16) * 8 + n % 8) * 4
        + (k % 32) / 8)
        * 2
        + (n % 16) / 8)
        * 2)
        + (k % 64) / 32;
    (word, (k % 8) as u32)
}

/// Stored index of entry (n, g) of a 16-bit group scale with `groups`
/// (padded) groups; vectors (`bias`, `smooth_factor`, `wcscales`) are the
/// case `groups = 1, g = 0`.
pub fn group_scale(n: usize, g: usize, groups: usize) -> usize {
    let t = n / 128;
    let c = n % 128;
    let (a, b, q, d) = (c / 16, (c % 16) / 8, (c % 8) / 2, c % 2);
    (t * groups + g) * 128 + 16 * a + 4 * q + 2 * b + d
}

/// Stored byte of the fp4 micro scale (n, g), `groups` (padded to 4) per row.
pub fn micro_scale(n: usize, g: usize, groups: usize) -> usize {
    let t = n / 128;
    let c = n % 128;
    let (s, x, y) = (c / 32, (c % 32) / 8, c % 8);
    let (h, f) = (g / 4, g % 4);
    ((((t * (groups / 4) + h) * 8 + y) * 4 + x) * 4 + s) * 4 + f
}

/// Position of element (i, j) inside a 16×16 low-rank block.
fn in_block(i: usize, j: usize) -> usize {
    (((((i % 8) * 4 + (j % 8) / 2) * 2 + i / 8) * 2 + j / 8) * 2) + j % 2
}

/// Stored index of `proj_down` element (k, r) (logical `[K, rank]`): blocks
/// of the `[rank, K]` matrix, K-block major.
pub fn proj_down(k: usize, r: usize, rank: usize) -> usize {
    ((k / 16) * (rank / 16) + r / 16) * 256 + in_block(r % 16, k % 16)
}

/// Stored index of `proj_up` element (n, r) (logical `[N, rank]`): blocks
/// N-block major.
pub fn proj_up(n: usize, r: usize, rank: usize) -> usize {
    ((n / 16) * (rank / 16) + r / 16) * 256 + in_block(n % 16, r % 16)
}

/// Row-major `[N, K/2]` bytes (low nibble = even column) of a packed qweight.
pub fn unpack_qweight(stored: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * cols / 2];
    for n in 0..rows {
        for k in 0..cols {
            let (w, nib) = qweight(n, k, cols);
            let byte = stored[w * 4 + (nib / 2) as usize];
            let code = if nib % 2 == 0 { byte & 0xF } else { byte >> 4 };
            out[n * cols / 2 + k / 2] |= code << (4 * (k % 2));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every formula is a bijection onto the stored range: `at(i, j)` over
    /// a `rows`×`cols` grid hits each of `0..rows·cols` once.
    fn bijective(rows: usize, cols: usize, at: impl Fn(usize, usize) -> usize) {
        let len = rows * cols;
        let mut seen = vec![false; len];
        for (i, j) in (0..rows).flat_map(|i| (0..cols).map(move |j| (i, j))) {
            let p = at(i, j);
            assert!(p < len, "{p} out of {len}");
            assert!(!seen[p], "{p} twice");
            seen[p] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn qweight_covers_every_nibble_once() {
        let (rows, cols) = (256, 192);
        bijective(rows, cols, |n, k| {
            let (w, nib) = qweight(n, k, cols);
            w * 8 + nib as usize
        });
    }

    #[test]
    fn qweight_by_hand() {
        // Row 8 sits in the second 8-row half of its 16-row pack; column 32
        // in the second 32-column half of its 64-column tile.
        assert_eq!(qweight(0, 0, 128), (0, 0));
        assert_eq!(qweight(0, 7, 128), (0, 7));
        assert_eq!(qweight(0, 32, 128), (1, 0));
        assert_eq!(qweight(8, 0, 128), (2, 0));
        assert_eq!(qweight(0, 8, 128), (4, 0));
        assert_eq!(qweight(1, 0, 128), (16, 0));
        assert_eq!(qweight(16, 0, 128), (128, 0));
        assert_eq!(qweight(0, 64, 128), (1024, 0));
        assert_eq!(qweight(128, 0, 128), (2048, 0));
    }

    #[test]
    fn group_and_micro_scales_cover_every_entry_once() {
        bijective(256, 4, |n, g| group_scale(n, g, 4));
        bijective(256, 8, |n, g| micro_scale(n, g, 8));
        type Scale = fn(usize, usize, usize) -> usize;
        let (group, micro): (Scale, Scale) = (group_scale, micro_scale);
        // Entry (n, g) of `groups` lands at `at`. Group scales: c = 2q + 8b
        // + 16a + d: row 2 is the next 4-wide step, row 8 the next pair.
        for (f, n, g, groups, at) in [
            (group, 1, 0, 1, 1),
            (group, 2, 0, 1, 4),
            (group, 8, 0, 1, 2),
            (group, 16, 0, 1, 16),
            (group, 0, 1, 2, 128),
            (group, 128, 0, 2, 256),
            (micro, 0, 1, 8, 1),
            (micro, 32, 0, 8, 4),
            (micro, 8, 0, 8, 16),
            (micro, 1, 0, 8, 64),
            (micro, 0, 4, 8, 512),
        ] {
            assert_eq!(f(n, g, groups), at, "({n}, {g}) of {groups} groups");
        }
    }

    #[test]
    fn low_rank_blocks_cover_every_entry_once() {
        let (k, rank, n) = (64, 32, 48);
        bijective(k, rank, |x, r| proj_down(x, r, rank));
        bijective(n, rank, |x, r| proj_up(x, r, rank));
        // Inside a block: j mod 2 is the fastest, then j div 8, i div 8, (j mod 8) div 2, i mod 8.
        assert_eq!(in_block(0, 1), 1);
        assert_eq!(in_block(0, 8), 2);
        assert_eq!(in_block(8, 0), 4);
        assert_eq!(in_block(0, 2), 8);
        assert_eq!(in_block(1, 0), 32);
        // proj_down blocks: K-block major, so K index 16 skips rank/16 blocks.
        assert_eq!(proj_down(16, 0, 32), 512);
        assert_eq!(proj_down(0, 16, 32), 256);
        assert_eq!(proj_down(1, 0, 32), in_block(0, 1));
        assert_eq!(proj_up(0, 1, 32), in_block(0, 1));
        assert_eq!(proj_up(16, 0, 32), 512);
    }

    #[test]
    fn unpack_round_trips() {
        let (rows, cols) = (128, 128);
        let code = |n: usize, k: usize| ((n * 7 + k * 3) % 16) as u8;
        let mut stored = vec![0u8; rows * cols / 2];
        for n in 0..rows {
            for k in 0..cols {
                let (w, nib) = qweight(n, k, cols);
                stored[w * 4 + nib as usize / 2] |= code(n, k) << (4 * (nib % 2));
            }
        }
        let logical = unpack_qweight(&stored, rows, cols);
        for n in 0..rows {
            for k in 0..cols {
                let b = logical[n * cols / 2 + k / 2];
                let got = if k % 2 == 0 { b & 0xF } else { b >> 4 };
                assert_eq!(got, code(n, k), "({n}, {k})");
            }
        }
    }
}
