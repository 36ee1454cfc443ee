s="1 2 3"
for x in $s; do echo "<$x>"; done
