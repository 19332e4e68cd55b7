"""Small helpers with no project imports: import paths, running moments."""
