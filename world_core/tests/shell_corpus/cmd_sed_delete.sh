printf '1\n2\n3\n4\n' | sed '2d'
printf '1\n2\n3\n4\n' | sed '/3/d'
