first_even() { for n in "$@"; do if (( n % 2 == 0 )); then echo "$n"; return 0; fi; done; return 1; }
first_even 3 5 8 10
first_even 1 3 || echo none
