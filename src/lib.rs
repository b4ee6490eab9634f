//! memwarden core (filled in by the core work).
