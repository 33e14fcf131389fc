"""LLM-written data as pure functions: parsing and cleaning of questions, thoughts and problems
(:mod:`.qa`) and controlled corruption (:mod:`.corruption`)."""
