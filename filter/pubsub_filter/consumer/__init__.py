"""The consumer's side: destination-side fencing (`fence`) and the stores of what it took (`stores`)."""
