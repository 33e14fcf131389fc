"""Domain mixtures, in one place: recipes (:mod:`.recipe`), the stream format (:mod:`.stream`), the
update rules as pure functions (:mod:`.rules`: topic-PPL, Velocitune, DBL), Velocitune's target
losses (:mod:`.velocitune`) and the training-time controller (:mod:`.controller`)."""
