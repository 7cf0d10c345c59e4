//! O(1) weighted host picking: exact round robin when weights are equal,
//! otherwise Vose's alias table walked by a golden-ratio (Weyl) sequence,
//! which spreads picks evenly without a random number source.

/// Fractional part of the golden ratio in 64-bit fixed point.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Picks among a tier's hosts by index, in proportion to their weights.
#[derive(Clone, Debug, PartialEq)]
pub enum Picker {
    /// Equal weights: the pick is `sequence % len`.
    RoundRobin {
        /// How many hosts.
        len: u64,
    },
    /// Unequal weights: Vose's alias table.
    Alias(AliasTable),
}

/// Vose's alias table over the hosts' weights: one column per host, a coin per pick.
#[derive(Clone, Debug, PartialEq)]
pub struct AliasTable {
    /// Per column: keep the column when the coin is below this (2^64 scale);
    /// `u64::MAX` means always keep.
    keep_below: Vec<u64>,
    alias: Vec<u32>,
}

impl Picker {
    /// Builds a picker over hosts with these weights (zero weights count as 1).
    /// Returns `None` for no hosts.
    pub fn new(weights: &[u32]) -> Option<Picker> {
        let first = *weights.first()?;
        if weights.iter().all(|w| *w == first) {
            return Some(Picker::RoundRobin {
                len: weights.len() as u64,
            });
        }
        Some(Picker::Alias(AliasTable::new(weights)))
    }

    /// The host index for the `sequence`-th pick.
    #[inline]
    pub fn pick(&self, sequence: u64) -> usize {
        match self {
            Picker::RoundRobin { len } => (sequence % len) as usize,
            Picker::Alias(table) => table.pick(sequence),
        }
    }
}

impl AliasTable {
    fn new(weights: &[u32]) -> AliasTable {
        let n = weights.len() as u128;
        let total: u128 = weights.iter().map(|w| u128::from((*w).max(1))).sum();
        // Column i holds weight w_i * n out of `total` per column: exact integers.
        let mut scaled: Vec<u128> = weights
            .iter()
            .map(|w| u128::from((*w).max(1)) * n)
            .collect();
        let mut keep_below = vec![u64::MAX; weights.len()];
        let mut alias: Vec<u32> = (0..weights.len() as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..weights.len()).partition(|i| scaled[*i] < total);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            keep_below[s] = ((scaled[s] << 64) / total) as u64;
            alias[s] = l as u32;
            scaled[l] = scaled[l] + scaled[s] - total;
            if scaled[l] < total {
                large.pop();
                small.push(l);
            }
        }
        // Whatever is left is full (exactly `total`): keep always (the default).
        AliasTable { keep_below, alias }
    }

    #[inline]
    fn pick(&self, sequence: u64) -> usize {
        let n = self.alias.len() as u64;
        let u = sequence.wrapping_mul(GOLDEN);
        let wide = u as u128 * n as u128;
        let column = (wide >> 64) as usize;
        let coin = wide as u64;
        match (self.keep_below.get(column), self.alias.get(column)) {
            (Some(&keep), Some(&other)) if keep != u64::MAX && coin >= keep => other as usize,
            _ => column,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(weights: &[u32], picks: u64) -> Vec<f64> {
        let p = Picker::new(weights).unwrap();
        let mut counts = vec![0u64; weights.len()];
        for s in 0..picks {
            counts[p.pick(s)] += 1;
        }
        counts.iter().map(|c| *c as f64 / picks as f64).collect()
    }

    #[test]
    fn empty_is_none() {
        assert_eq!(Picker::new(&[]), None);
    }

    #[test]
    fn equal_weights_are_exact_round_robin() {
        let p = Picker::new(&[5, 5, 5]).unwrap();
        let seq: Vec<_> = (0..6).map(|s| p.pick(s)).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn weighted_shares_within_one_percent() {
        for weights in [
            vec![1, 3],
            vec![1, 2, 3, 4],
            vec![100, 1, 1],
            vec![7, 0, 13, 1, 1, 50],
        ] {
            let total: u32 = weights.iter().map(|w| (*w).max(1)).sum();
            let got = shares(&weights, 100_000);
            for (w, share) in weights.iter().zip(&got) {
                let want = f64::from((*w).max(1)) / f64::from(total);
                assert!(
                    (share - want).abs() < 0.01,
                    "weights {weights:?}: got {got:?}"
                );
            }
        }
    }

    #[test]
    fn short_runs_are_spread_evenly() {
        // 1:3 over just 400 picks: the low-discrepancy walk keeps B at 0.75 ± 0.02.
        let got = shares(&[1, 3], 400);
        assert!((got[1] - 0.75).abs() < 0.02, "{got:?}");
        // No host waits long: in any window of 8 picks both appear.
        let p = Picker::new(&[1, 3]).unwrap();
        for start in 0..1000u64 {
            let window: Vec<_> = (start..start + 8).map(|s| p.pick(s)).collect();
            assert!(window.contains(&0) && window.contains(&1), "{window:?}");
        }
    }

    #[test]
    fn huge_weights_do_not_overflow() {
        let got = shares(&[u32::MAX, u32::MAX / 3, 1], 30_000);
        assert!((got[0] - 0.75).abs() < 0.01, "{got:?}");
        assert!(got[2] < 0.001, "{got:?}");
    }

    #[test]
    fn every_pick_is_in_range() {
        let weights: Vec<u32> = (1..=1000).collect();
        let p = Picker::new(&weights).unwrap();
        for s in (0..u64::MAX)
            .step_by((u64::MAX / 10_007) as usize)
            .take(10_007)
        {
            assert!(p.pick(s) < weights.len());
        }
    }
}
