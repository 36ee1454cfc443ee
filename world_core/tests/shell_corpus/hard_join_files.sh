printf '1 one\n2 two\n' > a
printf '1 uno\n2 dos\n' > b
join a b
