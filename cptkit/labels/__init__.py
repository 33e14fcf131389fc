"""Labels for documents: text classifiers (:mod:`.classifiers`: quality and topic), topic
taxonomies and the annotation prompt (:mod:`.topics`), and the classifier report (:mod:`.report`)."""
