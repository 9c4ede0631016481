//! User text quoted back in a message, cut to a readable length: a 1 MB backend name or a mesh of
//! 10,000 axes is named by its start and its size, not echoed in full.

use std::borrow::Cow;

/// The most characters of user text a message quotes.
pub const QUOTED: usize = 200;

/// `text` as a message quotes it: whole up to [`QUOTED`] characters, else its first ones and
/// how long it is.
pub fn clip(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(QUOTED) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}… ({} bytes in all)", &text[..end], text.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_whole_and_long_text_is_cut_at_a_character() {
        assert_eq!(clip("wgpu"), "wgpu");
        let exact = "x".repeat(QUOTED);
        assert_eq!(clip(&exact), exact.as_str());
        let long = "é".repeat(1000);
        let c = clip(&long);
        assert!(c.starts_with(&"é".repeat(QUOTED)) && c.ends_with("… (2000 bytes in all)"), "{c}");
        assert_eq!(c.chars().filter(|&ch| ch == 'é').count(), QUOTED);
    }
}
