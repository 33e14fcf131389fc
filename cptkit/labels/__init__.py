"""Labels for documents: text classifiers (:mod:`.classifiers`: training, saving and loading, for
quality and topic; one module per backend in :mod:`.backends`; settings in :mod:`.config`,
metrics in :mod:`.metrics`, the sentence encoder in :mod:`.encoder`), topic taxonomies and the
annotation prompt (:mod:`.topics`), and the classifier report (:mod:`.report`)."""
