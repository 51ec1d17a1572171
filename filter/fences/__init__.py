"""The consumer's store for `filter.fence`: SQLite (one file) or Firestore, behind `FenceStore`."""
