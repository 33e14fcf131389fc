"""Text processing: tokenization for BM25, shingling, language id."""
