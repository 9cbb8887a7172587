"""The bundled workloads, as user code: functions a job file names as "module:function"
(``tfsync.examples.images:cnn``) or by their short names (``model.name = "cnn"``,
``data.name = "mnist"``; ``tfsync.job.schema.MODELS`` and ``DATASETS``)."""
