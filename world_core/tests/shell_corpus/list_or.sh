false || echo fallback
true || echo never
