"""Where the job client's jobs run: the cluster (``kubernetes``) or this machine (``local``)."""
