"""End-to-end tests: real clients, a real broker and kproxy's relay between them."""
