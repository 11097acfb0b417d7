"""Command-line entry points: `mediator` (serve, records), `runctl`, and their helpers."""
