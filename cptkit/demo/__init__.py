"""The demo corpus: Debian documentation packages fetched with apt and parsed to records (:mod:`.corpus`)."""
