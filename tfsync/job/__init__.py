"""The job: a job file's configuration, its metrics, the limits it must fit."""
