"""Recording calls: the recorder (group commit on a writer thread, or inline on a SQLite file),
the batch insert of call rows, and the failed-call journal used while the records DB is away."""
