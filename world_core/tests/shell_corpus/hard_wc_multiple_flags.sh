printf 'one two\nthree four five\n' > f
wc -lw f
wc f
