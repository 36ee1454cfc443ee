f() { return 7; }
f; echo "got $?"
