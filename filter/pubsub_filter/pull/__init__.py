"""The pull surface: a streaming-pull worker over the engine, with its health port."""
