"""The payment providers' adapters behind one small protocol."""
