printf 'a\tb\\n\n'
printf '%%\n'
