n=8
if (( n % 2 == 0 )); then echo even; fi
