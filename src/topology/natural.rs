//! Natural order of names: runs of ASCII digits compare as numbers, everything else byte by
//! byte, so `2` sorts before `10`, `numa2` before `numa10`, `mlx5_2` before `mlx5_10` and
//! `0,5` before `0,10`. The one order chd sorts device ids, pair labels and sysfs entries in;
//! it lives here, at the bottom of the crate, so file readers, the analysis and the
//! collectors can all use it.

use std::cmp::Ordering;

/// Natural order of `a` and `b`. Equal digit runs of different lengths (`1`, `01`) order
/// shorter first, so only identical names compare equal.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while let (Some(&x), Some(&y)) = (a.first(), b.first()) {
        let order = if x.is_ascii_digit() && y.is_ascii_digit() {
            let (run_a, rest_a) = leading_digits(a);
            let (run_b, rest_b) = leading_digits(b);
            (a, b) = (rest_a, rest_b);
            let (value_a, value_b) = (significant(run_a), significant(run_b));
            value_a
                .len()
                .cmp(&value_b.len())
                .then_with(|| value_a.cmp(value_b))
                .then_with(|| run_a.len().cmp(&run_b.len()))
        } else {
            (a, b) = (&a[1..], &b[1..]);
            x.cmp(&y)
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

/// A name as a sort key in [`natural_cmp`] order, for tuples of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NaturalKey<'a>(pub &'a str);

impl Ord for NaturalKey<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        natural_cmp(self.0, other.0)
    }
}

impl PartialOrd for NaturalKey<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `name` as a [`NaturalKey`].
pub fn natural_key(name: &str) -> NaturalKey<'_> {
    NaturalKey(name)
}

/// Sort `names` in natural order.
pub fn sort_natural<S: AsRef<str>>(names: &mut [S]) {
    names.sort_unstable_by(|a, b| natural_cmp(a.as_ref(), b.as_ref()));
}

/// The leading run of digits of `s` and what follows it.
fn leading_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|c| c.is_ascii_digit()).count();
    s.split_at(n)
}

/// A digit run without its leading zeros.
fn significant(run: &[u8]) -> &[u8] {
    let zeros = run.iter().take_while(|c| **c == b'0').count();
    &run[zeros..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(names: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        sort_natural(&mut v);
        v
    }

    #[test]
    fn numbers_compare_by_value_wherever_they_stand() {
        assert_eq!(
            sorted(&["10", "2", "numa10", "numa2", "mlx5_10", "mlx5_2", "node9", "node10"]),
            ["2", "10", "mlx5_2", "mlx5_10", "node9", "node10", "numa2", "numa10"]
        );
        assert_eq!(
            sorted(&["0,10", "0,5", "10,11", "2,3"]),
            ["0,5", "0,10", "2,3", "10,11"]
        );
        assert_eq!(
            sorted(&["a01", "a1", "VL15_dropped", "link_downed"]),
            ["VL15_dropped", "a1", "a01", "link_downed"]
        );
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["10", "2", "numa10", "numa2"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["2", "10", "numa2", "numa10"]);
    }

    #[test]
    fn only_identical_names_are_equal() {
        assert_eq!(natural_cmp("npu3", "npu3"), Ordering::Equal);
        assert_eq!(natural_cmp("1", "01"), Ordering::Less);
        assert_eq!(natural_cmp("numa", "numa0"), Ordering::Less);
        assert_eq!(natural_cmp("", "0"), Ordering::Less);
        // Longer than u64: still by value.
        assert_eq!(
            natural_cmp("99999999999999999999", "100000000000000000000"),
            Ordering::Less
        );
    }

    #[test]
    fn keys_order_tuples() {
        let mut v = vec![
            (1, natural_key("10")),
            (0, natural_key("9")),
            (1, natural_key("9")),
        ];
        v.sort();
        assert_eq!(
            v,
            [
                (0, natural_key("9")),
                (1, natural_key("9")),
                (1, natural_key("10"))
            ]
        );
    }
}
