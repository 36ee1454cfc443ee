v=global
f() { local v=local; echo "$v"; }
f
echo "$v"
