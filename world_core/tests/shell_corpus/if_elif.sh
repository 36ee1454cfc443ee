for n in 1 5 10; do
  if [ $n -lt 3 ]; then echo "$n low"
  elif [ $n -lt 8 ]; then echo "$n mid"
  else echo "$n high"; fi
done
