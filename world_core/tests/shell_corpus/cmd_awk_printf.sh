printf 'pi 3.14159\n' | awk '{printf "%s=%.2f\n", $1, $2}'
