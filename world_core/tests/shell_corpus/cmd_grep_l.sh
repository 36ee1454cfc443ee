echo hit > a; echo miss > b; echo hit > c
grep -l hit a b c
