"""Infrastructure: HTTP clients and apps, authentication, storage backends, crash reports."""
