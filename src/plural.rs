//! Counted words in the lines the library writes: "1 tensor", "2 tensors".

/// `n word`, the word in its plural unless `n` is 1 (`-es` after a
/// sibilant: "2 patches").
pub(crate) fn plural(n: usize, word: &str) -> String {
    let sibilant = ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|e| word.ends_with(e));
    let suffix = match n {
        1 => "",
        _ if sibilant => "es",
        _ => "s",
    };
    format!("{n} {word}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::plural;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(plural(1, "tensor"), "1 tensor");
        assert_eq!(plural(0, "tensor"), "0 tensors");
        assert_eq!(plural(2, "quantization tensor"), "2 quantization tensors");
        assert_eq!(plural(1, "structural patch"), "1 structural patch");
        assert_eq!(plural(3, "structural patch"), "3 structural patches");
    }
}
