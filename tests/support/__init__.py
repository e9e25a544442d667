"""What the tests share: one clock, one config builder, the real servers and fakes they drive."""
