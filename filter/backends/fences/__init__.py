"""The consumer's store for `filter.core.fence`: SQLite (one file) or Firestore, behind `FenceStore`."""
