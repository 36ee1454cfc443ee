echo hello | rev
