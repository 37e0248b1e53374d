//! Errors as one line of text for logs and answers: the error and its sources, each once (the
//! useful part is often the innermost: rustls's reason, the kernel's errno).

/// `e` and its sources.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    with_sources(e.to_string(), e.source())
}

/// `text` followed by `source` and its own sources, leaving out any already in the text.
pub fn with_sources(mut text: String, mut source: Option<&dyn std::error::Error>) -> String {
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_appended_once() {
        let inner = std::io::Error::other("UnknownIssuer");
        let outer = std::io::Error::other(inner);
        // io::Error shows its inner error itself: it is not repeated.
        assert_eq!(error_chain(&outer), "UnknownIssuer");
        let io = std::io::Error::other("refused");
        assert_eq!(
            with_sources("connecting to etcd".into(), Some(&io)),
            "connecting to etcd: refused"
        );
    }
}
