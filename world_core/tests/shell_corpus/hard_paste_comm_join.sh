printf '1\n2\n3\n' > a
printf 'x\ny\nz\n' > b
paste a b
paste -sd, a
printf 'a\nb\nc\n' > l; printf 'b\nc\nd\n' > r
comm -12 l r
comm -3 l r
