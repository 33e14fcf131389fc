"""BM25 search backends behind one interface (base.Searcher); index directories (store)."""
